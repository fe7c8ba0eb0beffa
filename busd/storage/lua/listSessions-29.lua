--[[
  listSessions: a page of session ids. Without a time: every session with messages or state,
  in session id order. With a time: sessions whose state was set after it, oldest update
  first.

  Invariant: the order is stable between calls (ids, or update time then id), so pages do
  not overlap while nothing changes.

  Housekeeping first (bounded): expired locks, due scheduled messages, expired messages
  (session-wide), so that listed sessions reflect expiry.

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
    ARGV[7]   skip
    ARGV[8]   top
    ARGV[9]   updated after ms ('' any)

  Output:
    array of session ids

  Events:
    PUBLISH ARGV[2] ARGV[1] when housekeeping made messages or sessions available
]]
--- @include "queueContext"
--- @include "housekeeping"

local Q = queueContext()
local skip = tonumber(ARGV[7])
local top = tonumber(ARGV[8])
housekeeping(Q, Q.q)
if top <= 0 then return {} end

if ARGV[9] == '' then
  return redis.call('ZRANGE', Q.sessions, skip, skip + top - 1)
end
return redis.call('ZRANGEBYSCORE', Q.supdated, '(' .. ARGV[9], '+inf', 'LIMIT', skip, top)
