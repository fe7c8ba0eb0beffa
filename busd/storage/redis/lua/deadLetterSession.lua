--[[
  deadLetterSession: move every message of one session (available, locked, deferred,
  scheduled) to the dead-letter sub-queue at once, in sequence order, with a reason and a
  description, and the session's state with them (includes/deadLetterSession.lua). The
  session's lock, if any, stays with its holder; the messages it had in flight are gone
  from under it (settling them fails as for a lost lock). Messages sent to the session
  afterwards form it anew (docs/design.md §2.6).

  Invariant: a message is in exactly one of the two entities before and after; the
  session's messages keep their sequence numbers.

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] session id
    ARGV[c+2] dead-letter reason
    ARGV[c+3] dead-letter description ('' none)

  Output:
    the number of messages moved (0: the session has none)

  Events:
    wake-ups (includes/wakeWaiters.lua) of dead-letter receivers
]]
--- @include "queueContext"
--- @include "deadLetterSession"

local Q = queueContext(0, 0)
local description = ARGV[QUEUE_ARGC + 3]
if description == '' then description = nil end
return deadLetterSession(Q, ARGV[QUEUE_ARGC + 1], ARGV[QUEUE_ARGC + 2], description, nil)
