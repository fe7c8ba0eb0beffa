--- @include "addTo"
-- File session `sid` as free (it has available messages and no holder) with `seq`, the seq of
-- an available message of it: the lowest such seq wins (LT). A session that was not free
-- before wakes one waiting next-available receiver.
local function freeSession(Q, sid, seq)
  addTo(Q, 'ZADD', Q.sfree, seq, sid, nil, nil, 'LT', Q.swaiters)
end
