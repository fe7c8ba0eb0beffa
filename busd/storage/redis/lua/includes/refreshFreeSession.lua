--- @include "sessionRange"
--- @include "memberSeq"
--- @include "wakeWaiters"
--- @include "readMeta"
-- Keep the invariant: a session is in sfree, scored by the seq of its oldest available
-- message, exactly when it has available messages and no holder. A session that becomes free
-- here wakes one waiting next-available receiver.
-- What the caller knows saves looking: Q.held is a session the script checked its caller
-- holds (so it is not in sfree, and stays out); `unheld` says the caller has just removed
-- the session's holder (so it was not in sfree, and is only if it has available messages).
-- On a queue with a redelivery backoff (docs/design.md §2.17) a session whose first message
-- is not due yet is not free either: it waits for that message, which keeps its place.
local function refreshFreeSession(Q, sid, unheld)
  if Q.held == sid then return end
  if unheld or redis.call('HEXISTS', Q.sholder, sid) == 0 then
    local lo, hi = sessionRange(sid)
    local first = redis.call('ZRANGEBYLEX', Q.q.sready, lo, hi, 'LIMIT', 0, 1)[1]
    local waits = false
    if first and Q.bo then
      local m = readMeta(Q.q, memberSeq(first))
      waits = m and m.due and m.due > Q.now
      if waits then first = nil end
    end
    if first then
      if redis.call('ZADD', Q.sfree, memberSeq(first), sid) == 1 then
        wakeWaiters(Q, Q.swaiters, 1)
      end
      return
    end
    -- Held until now, it was not free; every message it got since was filed, then taken
    -- out again, through these functions.
    if unheld and not waits then return end
  end
  redis.call('ZREM', Q.sfree, sid)
end
