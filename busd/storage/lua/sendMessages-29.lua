--[[
  sendMessages: enqueue a batch of messages, all or none (one script call per batch).

  Each accepted message gets the queue's next sequence number (shared with the dead-letter
  sub-queue, so a dead-lettered message keeps it) and is enqueued now, or at its due time
  when scheduled in the future (then it is invisible until activateScheduled files it).
  A message with a session id is filed under its session on a session queue.

  Invariant: with duplicate detection on, a message id accepted within the last `window` ms
  is not accepted again; every message is in q.body, q.meta, q.all and the index of its state.

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
    ARGV[7]   duplicate detection window ms (0: off)
    ARGV[8]   '1' when the queue requires sessions
    ARGV[9..] five per message: blob, session id ('' none), message id ('' none),
              time to live ms ('' unbounded; already capped by the queue's default),
              scheduled enqueue time ms ('' none)

  Output:
    array: the sequence number of each message, 0 for a duplicate that was dropped

  Events:
    PUBLISH ARGV[2] ARGV[1] when a message is available now
]]
--- @include "queueContext"
--- @include "enqueueMessage"
--- @include "countEvent"

local Q = queueContext()
local window = tonumber(ARGV[7])
local sessionQueue = ARGV[8] == '1'

if window > 0 then
  -- ids older than the window no longer count (amortised: each id is removed once)
  redis.call('ZREMRANGEBYSCORE', Q.dedup, '-inf', Q.now - window)
end

local out = {}
local duplicates = 0
for i = 9, #ARGV, 5 do
  local mid = ARGV[i + 2]
  local duplicate = false
  if window > 0 and mid ~= '' then
    if redis.call('ZSCORE', Q.dedup, mid) then
      duplicate = true
    else
      redis.call('ZADD', Q.dedup, Q.now, mid)
    end
  end
  if duplicate then
    out[#out + 1] = 0
    duplicates = duplicates + 1
  else
    local sid = ARGV[i + 1]
    if sid == '' then sid = nil end
    out[#out + 1] = enqueueMessage(Q, ARGV[i], sid, tonumber(ARGV[i + 3]),
      tonumber(ARGV[i + 4]), sessionQueue)
  end
end
countEvent(Q, Q.q, 'sent', #out - duplicates)
countEvent(Q, Q.q, 'duplicates', duplicates)
return out
