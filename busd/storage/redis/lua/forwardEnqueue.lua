--[[
  forwardEnqueue: the destination's half of a move to a queue on a Redis Cluster, where the
  source lives in another slot (a single server moves in one step: forwardMessages). Each
  message is enqueued as forwardMessages would, unless the destination recorded it already:
  a forwarder that died after this step and before forwardSettle leaves its message at the
  source, which is taken and moved again, and must not arrive twice. The record goes when the
  forwarder, once the source deleted the message, asks this script to forget it.

  Invariant: a message (source, sequence number, enqueued time) is enqueued at most once.

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the destination's queue context (includes/queueContext.lua)
    ARGV[c+1] duplicate detection window ms (0: off)
    ARGV[c+2] '1' when the queue requires sessions
    ARGV[c+3] its default time to live ms ('' unbounded)
    ARGV[c+4] k, the number of records to forget, then the k records
    then eleven per message: record, blob, session id ('' none), message id ('' none), and
              the seven of includes/forwardedExtra.lua

  Output:
    array: per message 1 enqueued, 0 recorded already (left as it is)

  Events:
    wake-ups (includes/wakeWaiters.lua) when a message is available now
]]
--- @include "queueContext"
--- @include "forwardRecords"
--- @include "forwardedExtra"
--- @include "placeCopy"
--- @include "seenMessageId"
--- @include "countEvent"

local Q = queueContext(0, 0)
local window = tonumber(ARGV[QUEUE_ARGC + 1])
Q.live, Q.sessionQueue, Q.sent = true, ARGV[QUEUE_ARGC + 2] == '1', 0
Q.maxTtl = tonumber(ARGV[QUEUE_ARGC + 3])
local i = forwardRecords(Q.dedup, Q.now, window, QUEUE_ARGC + 5, tonumber(ARGV[QUEUE_ARGC + 4]))
local keep = Q.now + 86400000
local out = {}
local duplicates = 0
while i <= #ARGV do
  local record, blob, sid, mid = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local extra, ttl = forwardedExtra(i + 4)
  i = i + 11
  if sid == '' then sid = nil end
  if redis.call('ZSCORE', Q.dedup, record) then
    out[#out + 1] = 0
  else
    redis.call('ZADD', Q.dedup, keep, record)
    out[#out + 1] = 1
    if seenMessageId(Q.dedup, Q.now, window, mid) then
      duplicates = duplicates + 1
    else
      placeCopy(Q, redis.call('INCR', Q.seq), blob, sid, ttl, nil, extra)
    end
  end
end
countEvent(Q, Q.q, 'sent', Q.sent)
countEvent(Q, Q.q, 'duplicates', duplicates)
return out
