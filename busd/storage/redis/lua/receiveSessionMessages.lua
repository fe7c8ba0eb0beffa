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
    ARGV[c+1..] five per request: holder, session id, receive mode ('0' receive-and-delete,
              else peek-lock: 1, plus 2 to end the holder's standing offer, plus 8 to leave
              a new one, plus 4 to recover), count,
              and in peek-lock the lock tokens, 16 bytes each, one per message (at least
              `count`), as one string ('' otherwise)

  Standing offer (docs/design.md §3.5): a peek-lock request with 2 ends the offer its holder
  left before, and with 8 as well, taking fewer than `count` messages, none of them held back
  by a redelivery backoff, leaves a new one in `sbook` ('<the next token's last 8 bytes>
  <holder>'), under which sends of any process hand the session's next messages over
  (lua/sendMessages.lua). Its answer ends with the sequence numbers of the session's messages
  in flight under the holder's lock before it took any: those its process has not seen yet
  are on their way to it on wake-ups, and it waits for them.
  Recover (4): the holder may have missed wake-ups that carried messages handed over to it:
  the session's messages in flight under its lock come first in the answer, whether it
  delivered them or not (its process keeps those it has not).

  Output:
    per request: { 0, delivery row, ..., (with 2) { seq in flight, ... } } (includes/
    deliveryRow.lua; locked-until is the session's), or { -2 } SESSION_LOCK_LOST: its holder holds no live lock on the session

  Events:
    wake-ups (includes/wakeWaiters.lua) when housekeeping made messages or sessions available
]]
--- @include "queueContext"
--- @include "housekeeping"
--- @include "sessionLockedUntil"
--- @include "takeSessionMessages"
--- @include "countEvent"
--- @include "sessionRange"
--- @include "memberSeq"
--- @include "readMessage"
--- @include "deliveryRow"

local Q = queueContext(0, 0)
Q.caller = ARGV[QUEUE_ARGC + 1]
housekeeping(Q, Q.q)

local answers = {}
local received = 0
for i = QUEUE_ARGC + 1, #ARGV, 5 do
  local holder, sid = ARGV[i], ARGV[i + 1]
  Q.caller = holder -- its own wake-ups are not sent (includes/wakeHolder.lua)
  local tokens = false
  local mode = tonumber(ARGV[i + 2])
  if mode % 2 == 1 then tokens = ARGV[i + 4] end
  local lockedUntil = sessionLockedUntil(Q, sid, holder)
  if lockedUntil then
    local out = { 0 }
    local count = tonumber(ARGV[i + 3])
    local ends = tokens and mode % 4 >= 2
    local recovers = mode % 8 >= 4
    local inFlight
    if recovers or ends then
      local lo, hi = sessionRange(sid)
      inFlight = {}
      for _, member in ipairs(redis.call('ZRANGEBYLEX', Q.q.sinflight, lo, hi)) do
        local seq = memberSeq(member)
        inFlight[#inFlight + 1] = seq
        if recovers then -- what is in flight under this holder's lock
          local m, body = readMessage(Q.q, seq)
          if m and m.st == 'l' and m.h == holder then
            out[#out + 1] = deliveryRow(seq, body, m, m.tok, lockedUntil)
          end
        end
      end
    end
    Q.waits = false
    local taken = takeSessionMessages(Q, sid, count, tokens, lockedUntil, out)
    received = received + taken
    if ends then
      if mode >= 8 and taken < count and not Q.waits then
        local next = (taken + 1) * 16
        redis.call('HSET', Q.sbook, sid, string.sub(tokens, next - 7, next) .. holder)
      else
        redis.call('HDEL', Q.sbook, sid)
      end
      out[#out + 1] = inFlight
    end
    answers[#answers + 1] = out
  else
    answers[#answers + 1] = { -2 }
  end
end
countEvent(Q, Q.q, 'received', received) -- once for the call's requests together
return answers
