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
--- @include "sessionRange"
--- @include "memberSeq"
--- @include "readMeta"
--- @include "expireIfDue"
--- @include "takeMessage"
--- @include "tokenAt"
--- @include "countEvent"

local Q = queueContext(0, 0)
local holder = ARGV[7]
local sid = ARGV[8]
Q.caller = holder
local peekLock = ARGV[9] == '1'
local count = tonumber(ARGV[10])
housekeeping(Q, Q.q)

local lockedUntil = sessionLockedUntil(Q, sid, holder)
if not lockedUntil then return { -2 } end
Q.held = sid -- held: not free whatever it has available (includes/refreshFreeSession.lua)

local out = { 0 }
local lo, hi = sessionRange(sid)
while #out - 1 < count do
  local wanted = count - #out + 1
  local members = redis.call('ZRANGEBYLEX', Q.q.sready, lo, hi, 'LIMIT', 0, wanted)
  for _, member in ipairs(members) do
    local seq = memberSeq(member)
    local m = readMeta(Q.q, seq)
    if not m or m.st ~= 'a' then
      redis.call('ZREM', Q.q.sready, member) -- not available (cannot happen; never loop on it)
    elseif not expireIfDue(Q, seq, m) then
      local token = false
      if peekLock then token = tokenAt(ARGV[11], #out) end
      out[#out + 1] = takeMessage(Q, Q.q, seq, m, token, lockedUntil)
    end
  end
  -- fewer than asked: that was all of them (another look only replaces what was skipped)
  if #members < wanted then break end
end
countEvent(Q, Q.q, 'received', #out - 1)
return out
