--[[
  countEntity: message and session counts of an entity. Reads only.

  Invariant: changes nothing (no housekeeping either: counts are as stored).

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

  Output:
    { active, locked, scheduled, deferred, dead-lettered, sessions, locked sessions,
      event, total, event, total, ... }
    (sessions are 0 for the dead-letter sub-queue; the event totals are the entity's, from
    `stats` without the entity prefix: sent, received, completed, expired, ...)

  Events:
    none
]]
--- @include "queueContext"

local Q = queueContext()
local E = Q[ARGV[7]]
local function card(key) return redis.call('ZCARD', key) end
local out
if E.dlq then
  out = { card(E.ready), card(E.locked), 0, card(E.deferred), card(E.all), 0, 0 }
else
  out = {
    card(E.ready) + card(E.sready),
    card(E.locked) + card(E.sinflight),
    card(E.sched),
    card(E.deferred),
    card(Q.d.all),
    card(Q.sessions),
    redis.call('ZCOUNT', Q.slocks, '(' .. Q.now, '+inf'),
  }
end
local prefix = ARGV[7] .. '.'
local stats = redis.call('HGETALL', Q.stats)
for i = 1, #stats, 2 do
  if string.sub(stats[i], 1, 2) == prefix then
    out[#out + 1] = string.sub(stats[i], 3)
    out[#out + 1] = tonumber(stats[i + 1])
  end
end
return out
