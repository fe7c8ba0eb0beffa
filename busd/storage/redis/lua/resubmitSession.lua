--[[
  resubmitSession: move one session's dead letters back into the session, each under the
  sequence number it had, so that they come back in their original order and before any
  message the session got since; with delivery count 0, no dead-letter reason, enqueued now
  and living for the queue's default time to live from now. The state dead-lettered with the
  session comes back with it, unless the session has a state of its own by now (the newer
  one stays). Dead letters a dead-letter receiver holds locked stay where they are.

  Invariant: a message is in exactly one of the two entities before and after.

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] session id
    ARGV[c+2] the queue's default time to live ms ('' unbounded)

  Output:
    { moved, dead letters of the session left (locked) }

  Events:
    wake-ups (includes/wakeWaiters.lua): the session's holder, or a waiting next-available
    receiver
]]
--- @include "queueContext"
--- @include "resubmitSessionLetters"
--- @include "countEvent"

local Q = queueContext(0, 0)
local sid = ARGV[QUEUE_ARGC + 1]
local ttl = tonumber(ARGV[QUEUE_ARGC + 2])
local moved, left = resubmitSessionLetters(Q, sid, ttl)
countEvent(Q, Q.q, 'resubmitted', moved)
return { moved, left }
