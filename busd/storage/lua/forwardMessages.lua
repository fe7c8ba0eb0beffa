--[[
  forwardMessages: move messages a forwarder took (lua/forwardTake.lua) from the entity it
  forwards to the destination queue or topic, each in one step: taken off the source and
  enqueued at the destination as a new message (docs/design.md §3.16). Used where one script
  reaches both entities (a single server); on a Redis Cluster the move is made of
  forwardEnqueue (or forwardPublish) and forwardSettle.

  A moved message gets the destination's next sequence number, the enqueued time of now,
  delivery count 0 and its time to live capped by the destination's default; it keeps its
  blob and properties patch, and records the number first given to it (fs), one hop more,
  and when it comes from a dead-letter sub-queue that entity (dls) with its dead-letter reason
  and description. A topic fans it out with the placements its rules made (includes/
  fanOutMessage.lua). Duplicate detection is the destination's.

  A message that cannot move stays at the source: one with `hop limit` hops already, or whose
  destination no longer exists, is dead-lettered there with the reason; in a dead-letter
  sub-queue it is deferred there instead (with the reason), so that its forwarder does not
  take it again.

  Invariant: a message is at the source or at the destination, never both, never neither; a
  message whose lock is not the caller's token is left alone.

  Context: queue

  Input:
    KEYS, ARGV[1..6]  the source's queue context (includes/queueContext.lua); after it
              (from KEYS 35) the catalog hash (busd.storage.keys.catalog_key, outside every
              hash tag), then the destination's keys: a queue context, or a topic context
              with one queue context per subscription (includes/topicContext.lua); none when
              it is gone
    ARGV[7]   source entity: 'q' the queue, 'd' its dead-letter sub-queue
    ARGV[8]   the destination's catalog field (`<kind>:<path>`): must exist (a gone one
              is named `gone:<path>`)
    ARGV[9]   hop limit
    ARGV[10]  destination kind: 'q' queue, 't' topic, '' none
    destination 'q':
    ARGV[11..16]  its queue context parameters
    ARGV[17]  its duplicate detection window ms (0: off)
    ARGV[18]  '1' when it requires sessions
    ARGV[19]  its default time to live ms ('' unbounded)
    then, from ARGV[20]: the messages
    destination 't':
    ARGV[11]  topic name
    ARGV[12]  n: the number of subscriptions
    ARGV[13 .. 12+6n]  six per subscription, its queue context parameters
    ARGV[13+6n]  the topic's duplicate detection window ms (0: off)
    then two per subscription: '1' when it requires sessions, its default time to live ms;
    then the messages
    destination '': from ARGV[11], the messages
    per message: lock token, session id ('' none), message id ('' none), the number of
              placements p (-1: every subscription, unchanged; 0 for a queue), then p
              placements of seven (includes/fanOutMessage.lua)

  Output:
    array: per message 0 moved, 1 dead-lettered at the source, 2 deferred in the source's
    dead-letter sub-queue, -1 MESSAGE_LOCK_LOST (not the caller's any more: left alone)

  Events:
    wake-ups (includes/wakeWaiters.lua) where a message became available
]]
--- @include "queueContext"
--- @include "topicContext"
--- @include "topicSubscriptions"
--- @include "fanOutMessage"
--- @include "placeCopy"
--- @include "readMeta"
--- @include "deleteMessage"
--- @include "keepForwarded"
--- @include "seenMessageId"
--- @include "countEvent"
--- @include "countFanOut"
--- @include "catalogKey"

local HOPS_REASON = 'MaxTransferHopCountExceeded'
local HOPS_DESCRIPTION = 'The maximum number of allowed hops when forwarding between queues '
  .. 'has been exceeded. This value is set to 4.'
local GONE_REASON = 'MessagingEntityNotFound'

local Q = queueContext(0, 0)
local E = Q[ARGV[7]]
local limit = tonumber(ARGV[9])
local kind = ARGV[10]
local exists = redis.call('HEXISTS', catalogKey(34), ARGV[8]) == 1
local D, T, subs, dedup
local window = 0
local i = 11
if kind == 'q' then
  D = queueContext(35, 10)
  D.now = Q.now
  D.live, D.sessionQueue, D.maxTtl, D.sent = true, ARGV[18] == '1', tonumber(ARGV[19]), 0
  dedup = D.dedup
  window = tonumber(ARGV[17])
  i = 20
elseif kind == 't' then
  T = topicContext(35, 10)
  T.now = Q.now
  dedup = T.dedup
  local n = T.n
  local perSub = 0
  if n > 0 then perSub = (#KEYS - 39) / n end
  local b = 13 + 6 * n
  window = tonumber(ARGV[b])
  subs = topicSubscriptions(T, 35, 10, b, perSub)
  i = b + 2 * n + 1
end
if not exists then kind = '' end
if window > 0 then redis.call('ZREMRANGEBYSCORE', dedup, '-inf', Q.now - window) end

local out = {}
local moved, duplicates, dropped = 0, 0, 0
while i <= #ARGV do
  local token, sid, mid = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local np = tonumber(ARGV[i + 3])
  local first = i + 4
  i = first + 7 * math.max(np, 0)
  if sid == '' then sid = nil end
  local seq = redis.call('HGET', E.tokens, token)
  local m = seq and readMeta(E, seq)
  if not m or m.st ~= 'l' or m.tok ~= token then
    out[#out + 1] = -1
  else
    seq = tonumber(seq)
    local hop = m.hop or 0
    local reason, description
    if kind == '' then
      reason = GONE_REASON
      description = "The forwarding destination '" .. string.match(ARGV[8], ':(.*)$')
        .. "' does not exist."
    elseif hop >= limit then
      reason, description = HOPS_REASON, HOPS_DESCRIPTION
    end
    if reason then
      out[#out + 1] = keepForwarded(Q, E, seq, m, reason, description)
    else
      local blob = redis.call('HGET', E.body, seq)
      local extra = { fs = m.fs or seq, hop = hop + 1, pp = m.pp }
      if E.dlq then extra.dls, extra.dlr, extra.dld = Q.queue, m.dlr, m.dld end
      local ttl
      if m.exp then ttl = m.exp - m.enq end
      if seenMessageId(dedup, Q.now, window, mid) then
        duplicates = duplicates + 1
      elseif D then
        placeCopy(D, redis.call('INCR', D.seq), blob, sid, ttl, nil, extra)
      else
        local _, placed = fanOutMessage(T, subs, blob, sid, ttl, nil, np, first, extra)
        if placed == 0 then dropped = dropped + 1 end
      end
      deleteMessage(Q, E, seq, m)
      moved = moved + 1
      out[#out + 1] = 0
    end
  end
end
countEvent(Q, E, 'forwarded', moved)
if D then
  countEvent(D, D.q, 'sent', D.sent)
  countEvent(D, D.q, 'duplicates', duplicates)
elseif T then
  countFanOut(T, subs, moved - duplicates, duplicates, dropped)
end
return out
