--[[
  receiveSessionMessages: deliver up to `count` available messages of a session the holder
  has locked, in sequence order. Peek-lock puts them in flight under the caller's tokens
  (their lock is the session lock); receive-and-delete deletes them.

  Housekeeping first (bounded), as in receiveMessages. A message met past its time to live
  expires with its whole session.

  Invariant: only the live holder takes a session's messages, strictly in sequence order.

  Context: queue

  Input:
    KEYS, ARGV[1..6]  the queue context (includes/queueContext.lua)
    ARGV[7]   holder
    ARGV[8]   session id
    ARGV[9]   receive mode: '1' peek-lock, '0' receive-and-delete
    ARGV[10]  count
    ARGV[11]  peek-lock: the lock tokens, 16 bytes each, one per message (at least `count`),
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
local holder = ARGV[7]
local sid = ARGV[8]
Q.caller = holder
local tokens = false
if ARGV[9] == '1' then tokens = ARGV[11] end
housekeeping(Q, Q.q)

local lockedUntil = sessionLockedUntil(Q, sid, holder)
if not lockedUntil then return { -2 } end

local out = { 0 }
takeSessionMessages(Q, sid, tonumber(ARGV[10]), tokens, lockedUntil, out)
return out
