--- @include "expireMessageLocks"
--- @include "expireSessionLocks"
--- @include "activateScheduled"
--- @include "expireMessages"
-- The sweep's work, bounded by Q.budget per kind, done lazily before a script reads an
-- entity so that correctness never waits for the background sweep. Returns the ids of the
-- sessions whose lock expired.
local function housekeeping(Q, E)
  expireMessageLocks(Q, E, Q.budget)
  if E.dlq then return {} end
  local sids = expireSessionLocks(Q, Q.budget)
  activateScheduled(Q, Q.budget)
  expireMessages(Q, Q.budget)
  return sids
end
