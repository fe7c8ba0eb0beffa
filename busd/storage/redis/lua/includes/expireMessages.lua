--- @include "readMeta"
--- @include "expireIfDue"
-- Available messages past their time to live (at most `limit`, whole sessions at a time).
-- Returns how many index entries it met (`limit`: there may be more).
local function expireMessages(Q, limit)
  local seqs = redis.call('ZRANGEBYSCORE', Q.q.ttl, '-inf', Q.now, 'LIMIT', 0, limit)
  for _, s in ipairs(seqs) do
    local seq = tonumber(s)
    local m = readMeta(Q.q, seq)
    if m and m.st == 'a' then
      expireIfDue(Q, seq, m)
    else
      redis.call('ZREM', Q.q.ttl, s)
    end
  end
  return #seqs
end
