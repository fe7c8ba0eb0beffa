--[[
  forwardSettle: the source's half of a move on a Redis Cluster, after forwardEnqueue or
  forwardPublish stored the messages at the destination (which lives in another slot): each
  moved message is deleted at the source; one that could not move stays there, dead-lettered
  with its reason (in a dead-letter sub-queue: deferred there, as forwardMessages does).

  Invariant: only a message still locked under the forwarder's token changes; one whose lock
  ended came back and will be taken again, and its destination already holds it
  (forwardEnqueue makes the repeat a no-op).

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the source's queue context (includes/queueContext.lua)
    ARGV[c+1] entity: 'q' the queue, 'd' its dead-letter sub-queue
    ARGV[c+2..] three per message: lock token, dead-letter reason ('' when it moved),
              dead-letter description

  Output:
    array: per message 0 moved, 1 dead-lettered at the source, 2 deferred in the source's
    dead-letter sub-queue, -1 MESSAGE_LOCK_LOST (left alone)

  Events:
    wake-ups (includes/wakeWaiters.lua) when a dead-lettered message became available
]]
--- @include "queueContext"
--- @include "lockedMessage"
--- @include "deleteMessage"
--- @include "keepForwarded"
--- @include "countEvent"

local Q = queueContext(0, 0)
local E = Q[ARGV[QUEUE_ARGC + 1]]
local out = {}
local moved = 0
for i = QUEUE_ARGC + 2, #ARGV, 3 do
  local token, reason = ARGV[i], ARGV[i + 1]
  local seq, m = lockedMessage(E, token)
  if not seq then
    out[#out + 1] = -1
  else
    if reason == '' then
      deleteMessage(Q, E, seq, m)
      moved = moved + 1
      out[#out + 1] = 0
    else
      out[#out + 1] = keepForwarded(Q, E, seq, m, reason, ARGV[i + 2])
    end
  end
end
countEvent(Q, E, 'forwarded', moved)
return out
