--- @include "sessionRange"
--- @include "memberSeq"
--- @include "readMeta"
--- @include "returnMessage"
--- @include "refreshFreeSession"
--- @include "wake"
-- End a session's lock. Its delivered, unsettled messages are available again: with a
-- counted failed attempt when the lock expired (`failed`), without when the receiver closed.
-- The session becomes acceptable by next-available when it has available messages.
local function unlockSession(Q, sid, failed)
  local lo, hi = sessionRange(sid)
  for _, member in ipairs(redis.call('ZRANGEBYLEX', Q.q.sinflight, lo, hi)) do
    local seq = memberSeq(member)
    local m = readMeta(Q.q, seq)
    if m and m.st == 'l' then
      returnMessage(Q, Q.q, seq, m, failed)
    else
      redis.call('ZREM', Q.q.sinflight, member)
    end
  end
  redis.call('HDEL', Q.sholder, sid)
  redis.call('ZREM', Q.slocks, sid)
  refreshFreeSession(Q, sid)
  if redis.call('ZSCORE', Q.sfree, sid) then wake(Q) end
end
