--- @include "sessionHasMessages"
-- Whether session `sid` of `sessions` is left out of listings: a held session without
-- messages or state stays in `sessions` until its lock ends (lua/settleMessages.lua), and is
-- not listed meanwhile. `held`: the caller knows it has a holder.
local function unlistedSession(Q, sid, held)
  if not held and redis.call('HEXISTS', Q.sholder, sid) == 0 then return false end
  return not sessionHasMessages(Q, sid) and redis.call('HEXISTS', Q.sstate, sid) == 0
end
