--- @include "unindexMessage"
--- @include "forgetSessionIfEmpty"
local function deleteMessage(Q, E, seq, m)
  unindexMessage(Q, E, seq, m)
  redis.call('HDEL', E.body, seq)
  redis.call('HDEL', E.meta, seq)
  redis.call('ZREM', E.all, seq)
  if m.sid then
    redis.call('ZREM', E.sall, seqMember(m.sid, seq))
    if m.ss then forgetSessionIfEmpty(Q, m.sid) end
  end
end
