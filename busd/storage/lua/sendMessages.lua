--[[
  sendMessages: enqueue a batch of messages, all or none (one script call per batch).

  Each accepted message gets the queue's next sequence number (shared with the dead-letter
  sub-queue, so a dead-lettered message keeps it) and is enqueued now, or at its due time
  when scheduled in the future (then it is invisible until activateScheduled files it).
  A message with a session id is filed under its session on a session queue.

  Invariant: with duplicate detection on, a message id accepted within the last `window` ms
  is not accepted again; every message is in q.body, q.meta, q.all and the index of its state.

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] duplicate detection window ms (0: off)
    ARGV[c+2] '1' when the queue requires sessions
    ARGV[c+3..] five per message: blob, session id ('' none), message id ('' none),
              time to live ms ('' unbounded; already capped by the queue's default),
              scheduled enqueue time ms ('' none)

  Output:
    array: the sequence number of each message, 0 for a duplicate that was dropped

  Events:
    wake-ups (includes/wakeWaiters.lua) when a message is available now
]]
--- @include "queueContext"
--- @include "enqueueMessage"
--- @include "countEvent"

local Q = queueContext(0, 0)
local window = tonumber(ARGV[QUEUE_ARGC + 1])
local sessionQueue = ARGV[QUEUE_ARGC + 2] == '1'

if window > 0 then
  -- ids older than the window no longer count (amortised: each id is removed once)
  redis.call('ZREMRANGEBYSCORE', Q.dedup, '-inf', Q.now - window)
end

local out = {}
local duplicates = 0
for i = QUEUE_ARGC + 3, #ARGV, 5 do
  local mid = ARGV[i + 2]
  local duplicate = false
  if window > 0 and mid ~= '' then
    if redis.call('ZSCORE', Q.dedup, mid) then
      duplicate = true
    else
      redis.call('ZADD', Q.dedup, Q.now, mid)
    end
  end
  if duplicate then
    out[#out + 1] = 0
    duplicates = duplicates + 1
  else
    local sid = ARGV[i + 1]
    if sid == '' then sid = nil end
    out[#out + 1] = enqueueMessage(Q, ARGV[i], sid, tonumber(ARGV[i + 3]),
      tonumber(ARGV[i + 4]), sessionQueue)
  end
end
countEvent(Q, Q.q, 'sent', #out - duplicates)
countEvent(Q, Q.q, 'duplicates', duplicates)
return out
