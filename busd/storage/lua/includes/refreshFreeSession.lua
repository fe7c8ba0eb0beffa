--- @include "sessionRange"
--- @include "memberSeq"
--- @include "wakeWaiters"
-- Keep the invariant: a session is in sfree, scored by the seq of its oldest available
-- message, exactly when it has available messages and no holder. A session that becomes free
-- here wakes one waiting next-available receiver.
local function refreshFreeSession(Q, sid)
  if redis.call('HEXISTS', Q.sholder, sid) == 0 then
    local lo, hi = sessionRange(sid)
    local first = redis.call('ZRANGEBYLEX', Q.q.sready, lo, hi, 'LIMIT', 0, 1)[1]
    if first then
      if redis.call('ZADD', Q.sfree, memberSeq(first), sid) == 1 then
        wakeWaiters(Q, Q.swaiters, 1)
      end
      return
    end
  end
  redis.call('ZREM', Q.sfree, sid)
end
