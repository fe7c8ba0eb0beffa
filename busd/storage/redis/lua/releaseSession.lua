--[[
  releaseSession: the holder's receiver closed. The session is unlocked; its delivered,
  unsettled messages are available again without a counted attempt (with one when the lock
  had already expired), and the session can be accepted by next-available again.

  An operator's release (holder ''; the session inspector's "release a stuck lock") drops
  whoever holds the lock, likewise: the holder's next settle, renewal or state call then gets
  session-lock-lost. With `expire` (a fault on demand, docs/faults.md) the lock ends as an
  expired one does instead: the delivered messages come back with a counted failed attempt.

  Invariant: only the holder (or an operator) releases; a release by anyone else changes
  nothing.

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] holder ('' an operator: whoever holds it)
    ARGV[c+2] session id
    ARGV[c+3] '1': end the lock as if it had expired (optional)
    ARGV[c+4] '0': the holder never left a standing offer (lua/receiveSessionMessages.lua),
              so none is looked for (optional)

  Output:
    1 released, 0 not held (by this holder) (nothing changed)

  Events:
    wake-ups (includes/wakeWaiters.lua) when messages or the session became available
]]
--- @include "queueContext"
--- @include "releaseSessionLock"

local Q = queueContext(0, 0)
Q.unoffered = ARGV[QUEUE_ARGC + 4] == '0'
return releaseSessionLock(Q, ARGV[QUEUE_ARGC + 1], ARGV[QUEUE_ARGC + 2],
  ARGV[QUEUE_ARGC + 3] == '1')
