--[[
  forwardPublish: the destination's half of a move to a topic on a Redis Cluster: as
  forwardEnqueue, with the topic's fan-out (includes/fanOutMessage.lua) and the placements its
  rules made, and the records in the topic's duplicate-detection set.

  Invariant: a message (source, sequence number, enqueued time) is fanned out at most once.

  Context: topic

  Input:
    KEYS, ARGV[1..2+cn]  the topic context, with a queue context of c parameters for each of
              its n subscriptions (includes/topicContext.lua)
    then (b = 3+cn):
    ARGV[b]   duplicate detection window ms (0: off)
    ARGV[b+1 .. b+2n]  two per subscription: '1' when it requires sessions, its default time
              to live ms ('' unbounded)
    then k, the number of records to forget, and the k records
    then per message: record, blob, session id ('' none), message id ('' none), the seven of
              includes/forwardedExtra.lua, the number of placements p (-1: every
              subscription, unchanged), then p placements of seven (includes/fanOutMessage.lua)

  Output:
    array: per message 1 fanned out, 0 recorded already (left as it is)

  Events:
    wake-ups (includes/wakeWaiters.lua) in each subscription where a copy is available now
]]
--- @include "topicContext"
--- @include "topicSubscriptions"
--- @include "fanOutMessage"
--- @include "forwardRecords"
--- @include "forwardedExtra"
--- @include "seenMessageId"
--- @include "countFanOut"

local T = topicContext()
local n = T.n
local b = T.rest + 1
local window = tonumber(ARGV[b])
local subs = topicSubscriptions(T, 0, 0, b)
local first = b + 2 * n + 1
local i = forwardRecords(T.dedup, T.now, window, first + 1, tonumber(ARGV[first]))
local keep = T.now + 86400000
local out = {}
local sent, duplicates, dropped = 0, 0, 0
while i <= #ARGV do
  local record, blob, sid, mid = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local extra, ttl = forwardedExtra(i + 4)
  local np = tonumber(ARGV[i + 11])
  local placements = i + 12
  i = placements + 7 * math.max(np, 0)
  if sid == '' then sid = nil end
  if redis.call('ZSCORE', T.dedup, record) then
    out[#out + 1] = 0
  else
    redis.call('ZADD', T.dedup, keep, record)
    out[#out + 1] = 1
    if seenMessageId(T.dedup, T.now, window, mid) then
      duplicates = duplicates + 1
    else
      local _, placed = fanOutMessage(T, subs, blob, sid, ttl, nil, np, placements, extra)
      sent = sent + 1
      if placed == 0 then dropped = dropped + 1 end
    end
  end
end
countFanOut(T, subs, sent, duplicates, dropped)
return out
