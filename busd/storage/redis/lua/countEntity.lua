--[[
  countEntity: message and session counts of an entity. Reads only.

  Invariant: changes nothing (no housekeeping either: counts are as stored).

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] entity: 'q' or 'd'

  Output:
    { active, locked, scheduled, deferred, dead-lettered, sessions, locked sessions,
      free sessions, oldest message enqueued ms (0 none), event, total, event, total, ... }
    (active includes messages waiting out a redelivery backoff, docs/design.md §2.17)
    (sessions are 0 for the dead-letter sub-queue; free sessions have available messages and
    no holder; the oldest message is the lowest-numbered one not scheduled for later, among
    the entity's first ten; the event totals are the entity's, from
    `stats` without the entity prefix: sent, received, completed, expired, ...; a hand-over's
    'handed' is added to both sent and received)

  Events:
    none
]]
--- @include "queueContext"
--- @include "readMeta"
--- @include "messageSeqs"

local Q = queueContext(0, 0)
local E = Q[ARGV[QUEUE_ARGC + 1]]
local function card(key) return redis.call('ZCARD', key) end
-- Messages waiting out a redelivery backoff are active (as an abandoned message is in Service
-- Bus); those under a session are in sready already (includes/fileMessage.lua). A queue's
-- messages are all under sessions or none (includes/placeMessage.lua), so its first says.
local waiting = 0
if not E.dlq then
  local first = redis.call('ZRANGE', Q.q.backoff, 0, 0)[1]
  local m = first and readMeta(Q.q, tonumber(first))
  if m and not m.ss then waiting = card(Q.q.backoff) end
end
local out
if E.dlq then
  out = { card(E.ready), card(E.locked), 0, card(E.deferred), card(E.all), 0, 0, 0 }
else
  out = {
    card(E.ready) + card(E.sready) + waiting,
    card(E.locked) + card(E.sinflight),
    card(E.sched),
    card(E.deferred),
    card(Q.d.all),
    card(Q.sessions),
    redis.call('ZCOUNT', Q.slocks, '(' .. Q.now, '+inf'),
    card(Q.sfree),
  }
end
local oldest = 0
for _, seq in ipairs(messageSeqs(E, 0, 10)) do
  local m = readMeta(E, seq)
  if m and m.enq <= Q.now then
    oldest = m.enq
    break
  end
end
out[#out + 1] = oldest
local prefix = ARGV[QUEUE_ARGC + 1] .. '.'
local stats = redis.call('HGETALL', Q.stats)
local totals, names = {}, {}
local function add(name, n)
  if not totals[name] then names[#names + 1] = name end
  totals[name] = (totals[name] or 0) + n
end
for i = 1, #stats, 2 do
  if string.sub(stats[i], 1, 2) == prefix then
    local name, n = string.sub(stats[i], 3), tonumber(stats[i + 1])
    if name == 'handed' then -- sent and received at once (lua/sendMessages.lua)
      add('sent', n)
      add('received', n)
    else
      add(name, n)
    end
  end
end
for _, name in ipairs(names) do
  out[#out + 1] = name
  out[#out + 1] = totals[name]
end
return out
