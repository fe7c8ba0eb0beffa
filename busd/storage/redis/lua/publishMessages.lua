--[[
  publishMessages: store a batch sent to a topic in every subscription that takes it (fan-out),
  all or none, in one script call per batch.

  Each accepted message gets the topic's next sequence number, once; every copy keeps it (and
  the same enqueued time), so a subscription sees gaps. A second copy in one subscription
  (rules with actions) gets a number of its own: a subscription keeps messages by number. Duplicate detection is the topic's.
  Without placements a message goes, unchanged, to every live subscription (the TrueFilter
  path: the broker did not look at it); with placements, to the copies the subscriptions'
  rules made (several per subscription when rules with actions matched, each with its own
  blob, session id and time to live), or straight to a subscription's dead-letter sub-queue
  (a rule failed on it). A copy for a session subscription without a session id is
  dead-lettered there ('Session ID is null.'). A message no subscription takes is accepted
  and dropped. Scheduled messages are placed scheduled in each subscription, under the same
  number (cancelTopicScheduled removes every copy).

  Invariant: every copy is in its subscription's q.body (body and metadata), q.all and the
  index of its state (or in d.* when dead-lettered); a subscription not in `subs` (deleted) gets nothing;
  a copy's time to live is at most the subscription's default.

  Context: topic

  Input:
    KEYS, ARGV[1..2+cn]  the topic context, with a queue context of c parameters for each of
              its n subscriptions (includes/topicContext.lua)
    then (b = 3+cn):
    ARGV[b]   duplicate detection window ms (0: off)
    ARGV[b+1 .. b+2n]  two per subscription: '1' when it requires sessions, its default time
              to live ms ('' unbounded)
    ARGV[b+2n+1 ..]  per message: blob, session id ('' none), message id ('' none), time to
              live ms ('' unbounded; capped by the topic's default), scheduled enqueue time
              ms ('' none), the number of placements p (-1: every subscription, unchanged);
              then p placements of seven: subscription index (1-based), flags (1 own blob,
              2 own session id, 4 own time to live, 8 dead-letter), blob, session id, time to
              live, dead-letter reason, dead-letter description ('' where a flag is unset)

  Output:
    array: the sequence number of each message, 0 for a duplicate that was dropped

  Events:
    wake-ups (includes/wakeWaiters.lua) in each subscription where a copy is available now
]]
--- @include "topicContext"
--- @include "topicSubscriptions"
--- @include "fanOutMessage"
--- @include "countFanOut"
--- @include "flushAdds"

local T = topicContext()
local n = T.n
local b = T.rest + 1
local window = tonumber(ARGV[b])
local subs = topicSubscriptions(T, 0, 0, b)

if window > 0 then
  redis.call('ZREMRANGEBYSCORE', T.dedup, '-inf', T.now - window)
end

-- A call of several messages makes what they add to each subscription's indexes and bodies
-- one command per key (includes/addTo.lua) and reads a session's holder once, as
-- lua/sendMessages.lua does; a subscription with a redelivery backoff is left out: filing a
-- session's message there reads its session's first one (includes/refreshFreeSession.lua).
-- Messages that every subscription takes unchanged, with no duplicate detection, have their
-- numbers reserved by one INCRBY (a placement's second copy takes the next number at once,
-- so that it follows its original in its subscription).
local messages, unplaced, at = 0, true, b + 2 * n + 1
while at <= #ARGV do
  messages = messages + 1
  local np = tonumber(ARGV[at + 5])
  if np >= 0 then unplaced = false end
  at = at + 6 + 7 * math.max(np, 0)
end
local nextSeq
if messages > 1 then
  for _, Q in ipairs(subs) do
    if Q.live and not Q.bo then
      Q.adds, Q.filed, Q.added, Q.holders = { keys = {} }, {}, {}, {}
    end
  end
  if unplaced and window == 0 then
    nextSeq = redis.call('INCRBY', T.seq, messages) - messages + 1
  end
end

local out = {}
local duplicates, dropped = 0, 0
local i = b + 2 * n + 1
while i <= #ARGV do
  local blob, mid, due = ARGV[i], ARGV[i + 2], tonumber(ARGV[i + 4])
  local sid = ARGV[i + 1]
  if sid == '' then sid = nil end
  local ttl = tonumber(ARGV[i + 3])
  local np = tonumber(ARGV[i + 5])
  local first = i + 6
  i = first + 7 * math.max(np, 0)
  local duplicate = false
  if window > 0 and mid ~= '' then
    if redis.call('ZSCORE', T.dedup, mid) then
      duplicate = true
    else
      redis.call('ZADD', T.dedup, T.now, mid)
    end
  end
  if duplicate then
    out[#out + 1] = 0
    duplicates = duplicates + 1
  else
    local seq, placed = fanOutMessage(T, subs, blob, sid, ttl, due, np, first, nil, nextSeq)
    if nextSeq then nextSeq = nextSeq + 1 end
    out[#out + 1] = seq
    if placed == 0 then dropped = dropped + 1 end
  end
end
for _, Q in ipairs(subs) do flushAdds(Q) end
countFanOut(T, subs, #out - duplicates, duplicates, dropped)
return out
