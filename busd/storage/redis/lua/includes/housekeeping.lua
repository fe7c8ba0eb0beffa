--- @include "expireMessageLocks"
--- @include "expireSessionLocks"
--- @include "activateScheduled"
--- @include "expireMessages"
--- @include "activateBackoff"
-- How long a look that found nothing due lets the queue's next scripts skip theirs. Each look
-- reads four indexes; a busy queue runs a script per accept, receive or peek, and would read
-- them thousands of times a second to find nothing. What comes due within the window is
-- handled at most this late, by the next script after it or by the sweep; a delivery still
-- checks its own message's time to live (includes/expireIfDue.lua) and a settlement its own
-- lock's end (includes/checkSettlement.lua), so no expired message or lock is ever used.
local QUIET_MS = 10

-- The sweep's work, bounded by Q.budget per kind, done lazily before a script reads an
-- entity so that correctness never waits for the background sweep. Returns the ids of the
-- sessions whose lock expired. `always`: look even in a quiet window (the sweep). The window
-- is the queue's: a dead-letter sub-queue's script always looks at its own locks.
local function housekeeping(Q, E, always)
  if E.dlq then
    expireMessageLocks(Q, E, Q.budget)
    return {}
  end
  if not always and redis.call('EXISTS', Q.quiet) == 1 then return {} end
  local found = expireMessageLocks(Q, E, Q.budget)
  local sids = expireSessionLocks(Q, Q.budget)
  found = math.max(found, #sids, activateScheduled(Q, Q.budget), expireMessages(Q, Q.budget))
  -- a queue without redelivery backoff has nothing there to look at (but what the sweep
  -- releases once it was turned off, lua/sweepQueue.lua)
  if Q.bo then found = math.max(found, activateBackoff(Q, Q.budget, Q.now)) end
  -- A kind that met its budget may have more due: the next script looks again.
  if found < Q.budget then redis.call('SET', Q.quiet, '1', 'PX', QUIET_MS) end
  return sids
end
