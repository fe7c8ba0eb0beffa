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
    KEYS, ARGV[1..c]  the source's queue context (includes/queueContext.lua); after it
              (KEYS[QUEUE_KEYC + 1]) the catalog hash (busd.storage.keys.catalog_key, outside
              every hash tag), then the destination's keys: a queue context, or a topic context
              with one queue context per subscription (includes/topicContext.lua); none when
              it is gone
    ARGV[c+1] source entity: 'q' the queue, 'd' its dead-letter sub-queue
    ARGV[c+2] the destination's catalog field (`<kind>:<path>`): must exist (a gone one
              is named `gone:<path>`)
    ARGV[c+3] hop limit
    ARGV[c+4] destination kind: 'q' queue, 't' topic, '' none
    destination 'q':
    ARGV[c+5 .. 2c+4]  its queue context parameters
    ARGV[2c+5]  its duplicate detection window ms (0: off)
    ARGV[2c+6]  '1' when it requires sessions
    ARGV[2c+7]  its default time to live ms ('' unbounded)
    then, from ARGV[2c+8]: the messages
    destination 't':
    ARGV[c+5] topic name
    ARGV[c+6] n: the number of subscriptions
    ARGV[c+7 .. c+6+cn]  c per subscription, its queue context parameters
    ARGV[c+7+cn]  the topic's duplicate detection window ms (0: off)
    then two per subscription: '1' when it requires sessions, its default time to live ms;
    then the messages
    destination '': from ARGV[c+5], the messages
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
--- @include "lockedMessage"
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
local E = Q[ARGV[QUEUE_ARGC + 1]]
local limit = tonumber(ARGV[QUEUE_ARGC + 3])
local kind = ARGV[QUEUE_ARGC + 4]
local exists = redis.call('HEXISTS', catalogKey(QUEUE_KEYC), ARGV[QUEUE_ARGC + 2]) == 1
local at = QUEUE_ARGC + 4 -- the destination's arguments start at ARGV[at + 1]
local D, T, subs, dedup
local window = 0
local i = at + 1
if kind == 'q' then
  D = queueContext(QUEUE_KEYC + 1, at)
  local b = at + QUEUE_ARGC
  D.now = Q.now
  D.live, D.sessionQueue, D.maxTtl, D.sent = true, ARGV[b + 2] == '1', tonumber(ARGV[b + 3]), 0
  dedup = D.dedup
  window = tonumber(ARGV[b + 1])
  i = b + 4
elseif kind == 't' then
  T = topicContext(QUEUE_KEYC + 1, at)
  T.now = Q.now
  dedup = T.dedup
  local n = T.n
  local b = T.rest + 1
  window = tonumber(ARGV[b])
  subs = topicSubscriptions(T, QUEUE_KEYC + 1, at, b)
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
  local seq, m = lockedMessage(E, token)
  if not seq then
    out[#out + 1] = -1
  else
    local hop = m.hop or 0
    local reason, description
    if kind == '' then
      reason = GONE_REASON
      description = "The forwarding destination '" .. string.match(ARGV[QUEUE_ARGC + 2], ':(.*)$')
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
