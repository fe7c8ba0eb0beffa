--[[
  receiveSessionMessages: for each request, deliver up to `count` available messages of a
  session its holder has locked, in sequence order. Peek-lock puts them in flight under the
  request's tokens (their lock is the session lock); receive-and-delete deletes them. The
  requests of several receivers come in one call (busd/storage/redis/coalesce.py), each answered
  as if alone.

  Housekeeping first (bounded, once per call), as in receiveMessages. A message met past its
  time to live expires with its whole session.

  Invariant: only the live holder takes a session's messages, strictly in sequence order.

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1..] five per request: holder, session id, receive mode ('1' peek-lock, '0'
              receive-and-delete), count, and in peek-lock the lock tokens, 16 bytes each,
              one per message (at least `count`), as one string ('' otherwise)

  Output:
    per request: { 0, delivery row, ... } (includes/deliveryRow.lua; locked-until is the
    session's), or { -2 } SESSION_LOCK_LOST: its holder holds no live lock on the session

  Events:
    wake-ups (includes/wakeWaiters.lua) when housekeeping made messages or sessions available
]]
--- @include "queueContext"
--- @include "housekeeping"
--- @include "sessionLockedUntil"
--- @include "takeSessionMessages"
--- @include "countEvent"

local Q = queueContext(0, 0)
Q.caller = ARGV[QUEUE_ARGC + 1]
housekeeping(Q, Q.q)

local answers = {}
local received = 0
for i = QUEUE_ARGC + 1, #ARGV, 5 do
  local holder, sid = ARGV[i], ARGV[i + 1]
  Q.caller = holder -- its own wake-ups are not sent (includes/wakeHolder.lua)
  local tokens = false
  if ARGV[i + 2] == '1' then tokens = ARGV[i + 4] end
  local lockedUntil = sessionLockedUntil(Q, sid, holder)
  if lockedUntil then
    local out = { 0 }
    local count = tonumber(ARGV[i + 3])
    received = received + takeSessionMessages(Q, sid, count, tokens, lockedUntil, out)
    answers[#answers + 1] = out
  else
    answers[#answers + 1] = { -2 }
  end
end
countEvent(Q, Q.q, 'received', received) -- once for the call's requests together
return answers
