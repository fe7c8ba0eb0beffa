--[[
  receiveSessionMessages: deliver up to `count` available messages of a session the holder
  has locked, in sequence order. Peek-lock puts them in flight under the caller's tokens
  (their lock is the session lock); receive-and-delete deletes them.

  Housekeeping first (bounded), as in receiveMessages. A message met past its time to live
  expires with its whole session.

  Invariant: only the live holder takes a session's messages, strictly in sequence order.

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] holder
    ARGV[c+2] session id
    ARGV[c+3] receive mode: '1' peek-lock, '0' receive-and-delete
    ARGV[c+4] count
    ARGV[c+5] peek-lock: the lock tokens, 16 bytes each, one per message (at least `count`),
              as one string

  Output:
    { 0, delivery row, ... } (includes/deliveryRow.lua; locked-until is the session's)
    { -2 } SESSION_LOCK_LOST: the holder holds no live lock on the session

  Events:
    wake-ups (includes/wakeWaiters.lua) when housekeeping made messages or sessions available
]]
--- @include "queueContext"
--- @include "housekeeping"
--- @include "sessionLockedUntil"
--- @include "takeSessionMessages"

local Q = queueContext(0, 0)
local holder = ARGV[QUEUE_ARGC + 1]
local sid = ARGV[QUEUE_ARGC + 2]
Q.caller = holder
local tokens = false
if ARGV[QUEUE_ARGC + 3] == '1' then tokens = ARGV[QUEUE_ARGC + 5] end
housekeeping(Q, Q.q)

local lockedUntil = sessionLockedUntil(Q, sid, holder)
if not lockedUntil then return { -2 } end

local out = { 0 }
takeSessionMessages(Q, sid, tonumber(ARGV[QUEUE_ARGC + 4]), tokens, lockedUntil, out)
return out
