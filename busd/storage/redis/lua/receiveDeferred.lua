--[[
  receiveDeferred: fetch deferred messages by sequence number, all or none. Peek-lock locks
  them under the caller's tokens (then they settle like any delivery; unsettled, they go back
  to the deferred state); receive-and-delete deletes them. With a session id, every message
  must belong to that session and the holder must hold its live lock; on a session queue a
  session id is required.

  Invariant: only deferred messages are reached, and only this way.

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] entity: 'q' or 'd'
    ARGV[c+2] receive mode: '1' peek-lock, '0' receive-and-delete
    ARGV[c+3] session id ('' none)
    ARGV[c+4] holder ('' any)
    ARGV[c+5] n, the number of sequence numbers
    ARGV[c+6..c+5+n] sequence numbers
    ARGV[c+6+n]     peek-lock: the lock tokens, 16 bytes each, one per sequence number, as
                    one string

  Output:
    { 0, delivery row, ... } (includes/deliveryRow.lua)
    { -2 } SESSION_LOCK_LOST
    { -4 } MESSAGE_NOT_FOUND: some sequence number is not a deferred message (of the session)

  Events:
    none
]]
--- @include "queueContext"
--- @include "readMeta"
--- @include "sessionLockedUntil"
--- @include "takeMessage"
--- @include "tokenAt"
--- @include "countEvent"

local Q = queueContext(0, 0)
local E = Q[ARGV[QUEUE_ARGC + 1]]
local peekLock = ARGV[QUEUE_ARGC + 2] == '1'
local sid = ARGV[QUEUE_ARGC + 3]
local holder = ARGV[QUEUE_ARGC + 4]
if holder == '' then holder = false end
local n = tonumber(ARGV[QUEUE_ARGC + 5])

local lockedUntil = false
if sid ~= '' then
  lockedUntil = sessionLockedUntil(Q, sid, holder)
  if not lockedUntil then return { -2 } end
elseif peekLock then
  lockedUntil = Q.now + Q.lockMs
end

local found, seen = {}, {}
for i = 1, n do
  local seq = tonumber(ARGV[QUEUE_ARGC + 5 + i])
  local m = readMeta(E, seq)
  if not m or m.st ~= 'd' then return { -4 } end
  if sid ~= '' and m.sid ~= sid then return { -4 } end
  if sid == '' and m.ss then return { -4 } end
  if not seen[seq] then
    seen[seq] = true
    found[#found + 1] = { seq, m, i }
  end
end

local out = { 0 }
for _, f in ipairs(found) do
  local token = false
  if peekLock then token = tokenAt(ARGV[QUEUE_ARGC + 6 + n], f[3]) end
  if not peekLock then lockedUntil = false end
  out[#out + 1] = takeMessage(Q, E, f[1], f[2], token, lockedUntil)
end
countEvent(Q, E, 'received', #out - 1)
return out
