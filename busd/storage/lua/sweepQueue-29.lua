--[[
  sweepQueue: the periodic housekeeping of one queue and its dead-letter sub-queue, bounded
  by the budget per kind of work. Idempotent and safe on every broker process at once.

  Expired message locks (counted failed attempt, dead-lettered at MaxDeliveryCount), expired
  session locks (their in-flight messages likewise), scheduled messages that came due, and
  messages past their time to live (session-wide).

  Invariant: running it again (or on another process at once) finds nothing more to do
  until time passes: every item it handles leaves the index it was found in.

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

  Output:
    { expired message locks, expired messages, activated scheduled messages,
      session id whose lock expired, ... }

  Events:
    PUBLISH ARGV[2] ARGV[1] when messages or sessions became available
]]
--- @include "queueContext"
--- @include "housekeeping"
--- @include "expireMessageLocks"

local Q = queueContext()
local sids = housekeeping(Q, Q.q)
expireMessageLocks(Q, Q.d, Q.budget)
local out = { Q.expiredLocks, Q.expiredMessages, Q.activated }
for _, sid in ipairs(sids) do out[#out + 1] = sid end
return out
