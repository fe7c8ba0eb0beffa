--[[
  peekMessages: up to `count` messages of an entity with sequence number >= from, in any state
  (available, locked, deferred, scheduled), in order, without locking them; optionally only
  one session's.

  Invariant: no message is locked or otherwise changed by peeking (housekeeping aside).

  Housekeeping first (bounded), so that due scheduled messages show as active and expired
  ones are gone.

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] entity: 'q' or 'd'
    ARGV[c+2] from sequence number
    ARGV[c+3] count
    ARGV[c+4] session id ('' all)

  Output:
    array of delivery rows (includes/deliveryRow.lua; no lock token; locked-until of a
    locked message not filed under a session)

  Events:
    wake-ups (includes/wakeWaiters.lua) when housekeeping made messages or sessions available
]]
--- @include "queueContext"
--- @include "housekeeping"
--- @include "sessionSeqs"
--- @include "messageSeqs"
--- @include "readMeta"
--- @include "deliveryRow"

local Q = queueContext(0, 0)
local E = Q[ARGV[QUEUE_ARGC + 1]]
local from = math.max(tonumber(ARGV[QUEUE_ARGC + 2]), 0)
local count = tonumber(ARGV[QUEUE_ARGC + 3])
local sid = ARGV[QUEUE_ARGC + 4]
housekeeping(Q, E)
if count <= 0 then return {} end

local seqs
if sid == '' then
  seqs = messageSeqs(E, from, count)
else
  seqs = sessionSeqs(E, sid, from, count)
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
