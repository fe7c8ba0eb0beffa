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

  Invariant: every copy is in its subscription's q.body, q.meta, q.all and the index of its
  state (or in d.* when dead-lettered); a subscription not in `subs` (deleted) gets nothing;
  a copy's time to live is at most the subscription's default.

  Context: topic

  Input:
    KEYS      the topic context, then one queue context per subscription
              (includes/topicContext.lua)
    ARGV[1]   topic name
    ARGV[2]   n: the number of subscriptions
    ARGV[3..2+6n]  six per subscription, its queue context parameters
    then (b = 3+6n):
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
--- @include "queueContext"
--- @include "placeMessage"
--- @include "placeDeadLetter"
--- @include "countEvent"

local NO_SESSION_REASON = 'Session ID is null.'
local NO_SESSION_DESCRIPTION =
  "Session enabled entity doesn't allow a message whose session identifier is null."

local T = topicContext()
local n = T.n
local perSub = 0
if n > 0 then perSub = (#KEYS - 4) / n end
local b = 3 + 6 * n
local window = tonumber(ARGV[b])
local subs = {}
for i = 1, n do
  local Q = queueContext(4 + (i - 1) * perSub, 2 + (i - 1) * 6)
  Q.now = T.now  -- one clock for every copy
  Q.live = redis.call('SISMEMBER', T.subs, Q.queue) == 1
  Q.sessionQueue = ARGV[b + 2 * i - 1] == '1'
  Q.maxTtl = tonumber(ARGV[b + 2 * i])
  Q.sent = 0
  subs[i] = Q
end

if window > 0 then
  redis.call('ZREMRANGEBYSCORE', T.dedup, '-inf', T.now - window)
end

local function place(Q, seq, blob, sid, ttl, due)
  if not Q.live then return 0 end
  if Q.maxTtl and (not ttl or Q.maxTtl < ttl) then ttl = Q.maxTtl end
  if Q.sessionQueue and not sid then
    placeDeadLetter(Q, seq, blob, nil, NO_SESSION_REASON, NO_SESSION_DESCRIPTION)
  else
    placeMessage(Q, seq, blob, sid, ttl, due, Q.sessionQueue)
  end
  Q.sent = Q.sent + 1
  return 1
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
    local seq = redis.call('INCR', T.seq)
    out[#out + 1] = seq
    local placed = 0
    if np < 0 then
      for s = 1, n do placed = placed + place(subs[s], seq, blob, sid, ttl, due) end
    else
      local used = {}
      for p = first, first + 7 * (np - 1), 7 do
        local si = tonumber(ARGV[p])
        local Q = subs[si]
        -- a subscription keeps messages by number: a second copy there (a rule with an
        -- action) takes a number of its own from the topic's counter
        local cseq = seq
        if used[si] then cseq = redis.call('INCR', T.seq) end
        used[si] = true
        local flags = tonumber(ARGV[p + 1])
        local pblob, psid, pttl = blob, sid, ttl
        if bit.band(flags, 1) ~= 0 then pblob = ARGV[p + 2] end
        if bit.band(flags, 2) ~= 0 then
          psid = ARGV[p + 3]
          if psid == '' then psid = nil end
        end
        if bit.band(flags, 4) ~= 0 then pttl = tonumber(ARGV[p + 4]) end
        if bit.band(flags, 8) ~= 0 then
          if Q.live then
            placeDeadLetter(Q, cseq, pblob, psid, ARGV[p + 5], ARGV[p + 6])
            Q.sent = Q.sent + 1
            placed = placed + 1
          end
        else
          placed = placed + place(Q, cseq, pblob, psid, pttl, due)
        end
      end
    end
    if placed == 0 then dropped = dropped + 1 end
  end
end
for s = 1, n do countEvent(subs[s], subs[s].q, 'sent', subs[s].sent) end
local accepted = #out - duplicates
if accepted > 0 then redis.call('HINCRBY', T.tstats, 'sent', accepted) end
if duplicates > 0 then redis.call('HINCRBY', T.tstats, 'duplicates', duplicates) end
if dropped > 0 then redis.call('HINCRBY', T.tstats, 'dropped', dropped) end
return out
