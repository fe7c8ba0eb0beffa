--[[
  releaseProcessMessageLocks: a broker process is known to be gone (its parent saw it die,
  busd/workers.py): every message lock it held on the entity (the queue, or its dead-letter
  sub-queue) ends now, as if it had expired, instead of when it runs out. A worker's lock
  tokens carry its tag in bytes 9 to 12 (busd/storage/messages.py), and a locked message
  keeps its token (m.tok): so its locks are found without any record kept per lock.

  Each lock ends as an expired one does (includes/expireMessageLocks.lua): the message counts
  a failed delivery attempt and is available again (dead-lettered at MaxDeliveryCount).
  Session messages are not here: they are held by their session's lock
  (lua/releaseProcessLocks.lua).

  The locks are walked with ZSCAN over the entity's locked index, at most `budget` entries a
  call: the caller repeats with the returned cursor until it is '0'.

  Invariant: only locks whose token carries the tag end (the random bytes of another
  process's token match a 4-byte tag once in 2^32 locks, and such a lock then ends as an
  expired one would); no message is lost.

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] entity: 'q' the queue, 'd' its dead-letter sub-queue
    ARGV[c+2] the gone process's tag (4 bytes)
    ARGV[c+3] ZSCAN cursor over the entity's locked index ('0' to start)

  Output:
    { next cursor ('0': done), message locks released }

  Events:
    wake-ups (includes/wakeWaiters.lua) for the messages made available again
]]
--- @include "queueContext"
--- @include "readMeta"
--- @include "returnMessage"
--- @include "countEvent"

local Q = queueContext(0, 0)
local E = Q[ARGV[QUEUE_ARGC + 1]]
local tag = ARGV[QUEUE_ARGC + 2]
local cursor = ARGV[QUEUE_ARGC + 3]
if #tag ~= 4 then return redis.error_reply('releaseProcessMessageLocks: a tag is 4 bytes') end

local scan = redis.call('ZSCAN', E.locked, cursor, 'COUNT', Q.budget)
local released = 0
local entries = scan[2]
for i = 1, #entries, 2 do
  local seq = tonumber(entries[i])
  local m = readMeta(E, seq)
  -- ZSCAN may return an entry twice; the second time it is no longer locked.
  if m and m.st == 'l' and m.tok and string.sub(m.tok, 9, 12) == tag then
    returnMessage(Q, E, seq, m, true)
    released = released + 1
  end
end
countEvent(Q, E, 'lockexpired', released)
return { scan[1], released }
