--[[
  acceptSession: lock a session for a holder, either a specific one or the next available.

  Specific: locked when free or its lock expired (the expired lock's in-flight messages count
  a failed attempt first); extended when the same holder already holds it live; refused when
  someone else holds it live. The session may have no messages.
  Next available: the free session (available messages, no holder) whose oldest available
  message is the oldest. Scripts run one at a time, so concurrent acceptors get different
  sessions.

  Housekeeping first (bounded): expired locks, due scheduled messages, expired messages
  (session-wide).

  Invariant: a session has at most one holder; a held session is not in sfree.

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
    ARGV[7]   holder
    ARGV[8]   session id ('' next available)

  Output:
    { 0, session id, locked-until ms }
    { -3 } SESSION_CANNOT_BE_LOCKED: held live by another holder
    { -5 } NO_SESSION_AVAILABLE (next available only)

  Events:
    PUBLISH ARGV[2] ARGV[1] when housekeeping made messages or sessions available
]]
--- @include "queueContext"
--- @include "housekeeping"
--- @include "unlockSession"

local Q = queueContext()
local holder = ARGV[7]
local sid = ARGV[8]
housekeeping(Q, Q.q)

if sid ~= '' then
  local current = redis.call('HGET', Q.sholder, sid)
  if current then
    local until_ = tonumber(redis.call('ZSCORE', Q.slocks, sid))
    if until_ and until_ > Q.now then
      if current ~= holder then return { -3 } end
    else
      unlockSession(Q, sid, true)
    end
  end
else
  sid = redis.call('ZRANGE', Q.sfree, 0, 0)[1]
  if not sid then return { -5 } end
end

local lockedUntil = Q.now + Q.lockMs
redis.call('HSET', Q.sholder, sid, holder)
redis.call('ZADD', Q.slocks, lockedUntil, sid)
redis.call('ZREM', Q.sfree, sid)
return { 0, sid, lockedUntil }
