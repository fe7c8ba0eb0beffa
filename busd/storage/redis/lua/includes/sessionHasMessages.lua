--- @include "sessionRange"
-- Whether session `sid` has messages in the queue. A session message is in one of three
-- indexes by its state: available in sready, in flight in sinflight, deferred or scheduled
-- in sall (includes/fileMessage.lua; one written by a store before this layout is in sall
-- too). A script that names only some of them (Q.q lacks the others) looks at those.
local function sessionHasMessages(Q, sid)
  local lo, hi = sessionRange(sid)
  local q = Q.q
  for _, index in ipairs({ q.sall, q.sready or false, q.sinflight or false }) do
    if index and redis.call('ZLEXCOUNT', index, lo, hi) ~= 0 then return true end
  end
  return false
end
