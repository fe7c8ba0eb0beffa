--[[
  receiveMessages: deliver up to `count` available messages of an entity (the queue, or its
  dead-letter sub-queue) that are not filed under a session, oldest sequence number first.
  Peek-lock locks each for LockDuration under the caller's token; receive-and-delete deletes.

  Housekeeping first (bounded): expired message locks, and on the queue also expired session
  locks, due scheduled messages and expired messages. A message met past its time to live
  is expired, not delivered.

  Invariant: a delivered message is in exactly one of {locked, deleted}; tokens maps its
  token to it while locked.

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
    ARGV[7]   entity: 'q' the queue, 'd' its dead-letter sub-queue
    ARGV[8]   receive mode: '1' peek-lock, '0' receive-and-delete
    ARGV[9]   count
    ARGV[10..] peek-lock: one lock token per message (at least `count`)

  Output:
    array of delivery rows (includes/deliveryRow.lua)

  Events:
    PUBLISH ARGV[2] ARGV[1] when housekeeping made messages or sessions available
]]
--- @include "queueContext"
--- @include "housekeeping"
--- @include "readMeta"
--- @include "expireIfDue"
--- @include "takeMessage"

local Q = queueContext()
local E = Q[ARGV[7]]
local peekLock = ARGV[8] == '1'
local count = tonumber(ARGV[9])
housekeeping(Q, E)

local lockedUntil = false
if peekLock then lockedUntil = Q.now + Q.lockMs end
local out = {}
while #out < count do
  local seqs = redis.call('ZRANGE', E.ready, 0, count - #out - 1)
  if #seqs == 0 then break end
  for _, s in ipairs(seqs) do
    local seq = tonumber(s)
    local m = readMeta(E, seq)
    if not m or m.st ~= 'a' then
      redis.call('ZREM', E.ready, s) -- not available (cannot happen; never loop on it)
    elseif E.dlq or not expireIfDue(Q, seq, m) then
      local token = false
      if peekLock then token = ARGV[10 + #out] end
      out[#out + 1] = takeMessage(Q, E, seq, m, token, lockedUntil)
    end
  end
end
return out
