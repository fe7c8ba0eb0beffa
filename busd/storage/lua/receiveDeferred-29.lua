--[[
  receiveDeferred: fetch deferred messages by sequence number, all or none. Peek-lock locks
  them under the caller's tokens (then they settle like any delivery; unsettled, they go back
  to the deferred state); receive-and-delete deletes them. With a session id, every message
  must belong to that session and the holder must hold its live lock; on a session queue a
  session id is required.

  Invariant: only deferred messages are reached, and only this way.

  Input:
    KEYS[1]   seq         last sequence number given out (queue and DLQ)
    KEYS[2]   dedup       message-id -> ms first seen (duplicate detection)
    KEYS[3]   sfree       session id -> oldest available seq; free sessions
    KEYS[4]   sholder     session id -> holder of its lock
    KEYS[5]   slocks      session id -> ms its lock ends
    KEYS[6]   sstate      session id -> state
    KEYS[7]   supdated    session id -> ms its state was last set
    KEYS[8]   sessions    sessions with messages or state (lexicographic)
    KEYS[9]   q.body      queue: seq -> blob
    KEYS[10]  q.meta      queue: seq -> packed metadata (includes/readMeta.lua)
    KEYS[11]  q.all       queue: every message, by seq
    KEYS[12]  q.ready     queue: available messages not under a session, by seq
    KEYS[13]  q.locked    queue: locked messages not under a session, by lock end
    KEYS[14]  q.tokens    queue: lock token -> seq
    KEYS[15]  q.deferred  queue: deferred messages, by seq
    KEYS[16]  q.sall      queue: <sid>\0<seq16> of every message with a session id
    KEYS[17]  q.sched     queue: scheduled messages, by due ms
    KEYS[18]  q.ttl       queue: available messages with a TTL, by expiry ms
    KEYS[19]  q.sready    queue: <sid>\0<seq16> of available session messages
    KEYS[20]  q.sinflight queue: <sid>\0<seq16> of delivered, unsettled session messages
    KEYS[21]  d.body      DLQ: seq -> blob
    KEYS[22]  d.meta      DLQ: seq -> packed metadata (includes/readMeta.lua)
    KEYS[23]  d.all       DLQ: every message, by seq
    KEYS[24]  d.ready     DLQ: available messages not under a session, by seq
    KEYS[25]  d.locked    DLQ: locked messages not under a session, by lock end
    KEYS[26]  d.tokens    DLQ: lock token -> seq
    KEYS[27]  d.deferred  DLQ: deferred messages, by seq
    KEYS[28]  d.sall      DLQ: <sid>\0<seq16> of every message with a session id
    KEYS[29]  stats       queue: <entity>.<event> -> count, monotonic totals (metrics)
    ARGV[1]   queue name (published on wake-ups)
    ARGV[2]   wake-up channel
    ARGV[3]   lock duration ms
    ARGV[4]   max delivery count
    ARGV[5]   '1' to dead-letter expired messages, '0' to drop them
    ARGV[6]   housekeeping budget (items per kind of work)
    ARGV[7]   entity: 'q' or 'd'
    ARGV[8]   receive mode: '1' peek-lock, '0' receive-and-delete
    ARGV[9]   session id ('' none)
    ARGV[10]  holder ('' any)
    ARGV[11]  n, the number of sequence numbers
    ARGV[12..11+n]  sequence numbers
    ARGV[12+n..]    peek-lock: one lock token per sequence number

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

local Q = queueContext()
local E = Q[ARGV[7]]
local peekLock = ARGV[8] == '1'
local sid = ARGV[9]
local holder = ARGV[10]
if holder == '' then holder = false end
local n = tonumber(ARGV[11])

local lockedUntil = false
if sid ~= '' then
  lockedUntil = sessionLockedUntil(Q, sid, holder)
  if not lockedUntil then return { -2 } end
elseif peekLock then
  lockedUntil = Q.now + Q.lockMs
end

local found, seen = {}, {}
for i = 1, n do
  local seq = tonumber(ARGV[11 + i])
  local m = readMeta(E, seq)
  if not m or m.st ~= 'd' then return { -4 } end
  if sid ~= '' and m.sid ~= sid then return { -4 } end
  if sid == '' and m.ss then return { -4 } end
  if not seen[seq] then
    seen[seq] = true
    found[#found + 1] = { seq, m, ARGV[11 + n + i] }
  end
end

local out = { 0 }
for _, f in ipairs(found) do
  local token = false
  if peekLock then token = f[3] end
  if not peekLock then lockedUntil = false end
  out[#out + 1] = takeMessage(Q, E, f[1], f[2], token, lockedUntil)
end
return out
