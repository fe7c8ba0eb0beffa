--[[
  purgeEntity: delete every message of an entity (the queue, or its dead-letter sub-queue).
  Purging the queue keeps session state and session locks; sessions left with neither
  messages nor state cease to exist.

  Invariant: sequence numbers are not reused after a purge (the counter stays), and the
  event totals stay (they only grow).

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
    the number of messages deleted

  Events:
    none
]]
--- @include "queueContext"
--- @include "countEvent"

local Q = queueContext()
local E = Q[ARGV[7]]
local n = redis.call('ZCARD', E.all)
for name, key in pairs(E) do
  if name ~= 'dlq' then redis.call('UNLINK', key) end
end
if not E.dlq then
  redis.call('UNLINK', Q.sfree)
  for _, sid in ipairs(redis.call('ZRANGE', Q.sessions, 0, -1)) do
    if redis.call('HEXISTS', Q.sstate, sid) == 0 then
      redis.call('ZREM', Q.sessions, sid)
      redis.call('ZREM', Q.supdated, sid)
    end
  end
end
countEvent(Q, E, 'purged', n)
return n
