--[[
  resubmitDeadLetters: move up to `limit` dead-lettered messages back into the queue as new
  messages, oldest first: each gets a new sequence number, is enqueued now with delivery
  count 0 and no dead-letter reason, keeps its body, session id and properties patch, and
  lives for the queue's default time to live from now (its own may be what expired it).
  Messages a dead-letter receiver holds locked stay where they are.

  Invariant: a message is in exactly one of the two entities before and after; on a session
  queue a message without a session id stays in the dead-letter sub-queue (it could never be
  received from the queue).

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
    ARGV[7]   '1' when the queue requires sessions
    ARGV[8]   the queue's default time to live ms ('' unbounded)
    ARGV[9]   at most this many messages

  Output:
    { moved, dead-lettered messages still available or deferred afterwards }

  Events:
    PUBLISH ARGV[2] ARGV[1] when a message became available
]]
--- @include "queueContext"
--- @include "readMeta"
--- @include "deleteMessage"
--- @include "enqueueMessage"
--- @include "countEvent"

local Q = queueContext()
local sessionQueue = ARGV[7] == '1'
local ttl = tonumber(ARGV[8])
local limit = tonumber(ARGV[9])

-- The oldest available or deferred dead-letter messages (locked ones are being handled).
local candidates = {}
for _, key in ipairs({ Q.d.ready, Q.d.deferred }) do
  if limit < 1 then break end
  for _, s in ipairs(redis.call('ZRANGE', key, 0, limit - 1)) do
    candidates[#candidates + 1] = tonumber(s)
  end
end
table.sort(candidates)

local moved = 0
for _, seq in ipairs(candidates) do
  if moved >= limit then break end
  local m = readMeta(Q.d, seq)
  if m and (m.st == 'a' or m.st == 'd') then
    if m.sid or not sessionQueue then
      local body = redis.call('HGET', Q.d.body, seq)
      deleteMessage(Q, Q.d, seq, m)
      enqueueMessage(Q, body, m.sid, ttl, nil, sessionQueue, m.pp)
      moved = moved + 1
    end
  end
end
countEvent(Q, Q.q, 'resubmitted', moved)
return { moved, redis.call('ZCARD', Q.d.ready) + redis.call('ZCARD', Q.d.deferred) }
