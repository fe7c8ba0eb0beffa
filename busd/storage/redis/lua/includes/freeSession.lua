--- @include "wakeWaiters"
-- File session `sid` as free (it has available messages and no holder) with `seq`, the seq of
-- an available message of it: the lowest such seq wins (LT). A session that was not free
-- before wakes one waiting next-available receiver.
local function freeSession(Q, sid, seq)
  if redis.call('ZADD', Q.sfree, 'LT', seq, sid) == 1 then
    wakeWaiters(Q, Q.swaiters, 1)
  end
end
