--[[
  peekMessages: up to `count` messages of an entity with sequence number >= from, in any state
  (available, locked, deferred, scheduled), in order, without locking them; optionally only
  one session's.

  Invariant: no message is locked or otherwise changed by peeking (housekeeping aside).

  Housekeeping first (bounded), so that due scheduled messages show as active and expired
  ones are gone.

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
    ARGV[8]   from sequence number
    ARGV[9]   count
    ARGV[10]  session id ('' all)

  Output:
    array of delivery rows (includes/deliveryRow.lua; no lock token; locked-until of a
    locked message not filed under a session)

  Events:
    PUBLISH ARGV[2] ARGV[1] when housekeeping made messages or sessions available
]]
--- @include "queueContext"
--- @include "housekeeping"
--- @include "seqMember"
--- @include "memberSeq"
--- @include "readMeta"
--- @include "deliveryRow"

local Q = queueContext()
local E = Q[ARGV[7]]
local from = math.max(tonumber(ARGV[8]), 0)
local count = tonumber(ARGV[9])
local sid = ARGV[10]
housekeeping(Q, E)
if count <= 0 then return {} end

local seqs
if sid == '' then
  seqs = redis.call('ZRANGEBYSCORE', E.all, from, '+inf', 'LIMIT', 0, count)
else
  seqs = {}
  local members = redis.call('ZRANGEBYLEX', E.sall, '[' .. seqMember(sid, from),
    '(' .. sid .. '\1', 'LIMIT', 0, count)
  for i, member in ipairs(members) do seqs[i] = memberSeq(member) end
end

local out = {}
for _, s in ipairs(seqs) do
  local seq = tonumber(s)
  local m = readMeta(E, seq)
  if m then
    out[#out + 1] = deliveryRow(seq, redis.call('HGET', E.body, seq), m, false, m.lu)
  end
end
return out
