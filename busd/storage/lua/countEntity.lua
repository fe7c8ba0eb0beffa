--[[
  countEntity: message and session counts of an entity. Reads only.

  Invariant: changes nothing (no housekeeping either: counts are as stored).

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] entity: 'q' or 'd'

  Output:
    { active, locked, scheduled, deferred, dead-lettered, sessions, locked sessions,
      event, total, event, total, ... }
    (sessions are 0 for the dead-letter sub-queue; the event totals are the entity's, from
    `stats` without the entity prefix: sent, received, completed, expired, ...)

  Events:
    none
]]
--- @include "queueContext"

local Q = queueContext(0, 0)
local E = Q[ARGV[QUEUE_ARGC + 1]]
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
local prefix = ARGV[QUEUE_ARGC + 1] .. '.'
local stats = redis.call('HGETALL', Q.stats)
for i = 1, #stats, 2 do
  if string.sub(stats[i], 1, 2) == prefix then
    out[#out + 1] = string.sub(stats[i], 3)
    out[#out + 1] = tonumber(stats[i + 1])
  end
end
return out
