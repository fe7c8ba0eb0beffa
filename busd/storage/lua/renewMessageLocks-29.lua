--[[
  renewMessageLocks: extend the locks of delivered messages by LockDuration from now, all or
  none. A session message's lock is its session's: it is reported, not extended (the session
  lock is renewed with renewSessionLock).

  Invariant: only a live lock is extended.

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
    ARGV[8..] lock tokens

  Output:
    { 0, locked-until ms per token }
    { -1 } MESSAGE_LOCK_LOST: some token is not a live lock (nothing changed)

  Events:
    none
]]
--- @include "queueContext"
--- @include "readMeta"
--- @include "writeMeta"
--- @include "sessionLockedUntil"

local Q = queueContext()
local E = Q[ARGV[7]]
local found = {}
for i = 8, #ARGV do
  local seq = redis.call('HGET', E.tokens, ARGV[i])
  local m = seq and readMeta(E, tonumber(seq))
  if not m or m.st ~= 'l' or m.tok ~= ARGV[i] then return { -1 } end
  if m.ss then
    if not sessionLockedUntil(Q, m.sid, false) then return { -1 } end
  elseif m.lu <= Q.now then
    return { -1 }
  end
  found[#found + 1] = { tonumber(seq), m }
end

local out = { 0 }
local lockedUntil = Q.now + Q.lockMs
for _, f in ipairs(found) do
  local seq, m = f[1], f[2]
  if m.ss then
    out[#out + 1] = sessionLockedUntil(Q, m.sid, false)
  else
    m.lu = lockedUntil
    redis.call('ZADD', E.locked, lockedUntil, seq)
    writeMeta(E, seq, m)
    out[#out + 1] = lockedUntil
  end
end
return out
