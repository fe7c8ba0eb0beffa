--[[
  sweepQueue: the periodic housekeeping of one queue and its dead-letter sub-queue, bounded
  by the budget per kind of work. Idempotent and safe on every broker process at once.

  Expired message locks (counted failed attempt, dead-lettered at MaxDeliveryCount), expired
  session locks (their in-flight messages likewise), scheduled messages that came due,
  messages past their time to live (session-wide), and, when the entity has a
  SessionIdleTimeToLive, sessions idle (no messages, no holder) for longer than it: their
  state and bookkeeping go (includes/expireIdleSessions.lua). Messages whose redelivery
  backoff ended become available (includes/housekeeping.lua); on a queue whose backoff was
  turned off, all those still waiting do (docs/design.md §2.17).

  Wake-ups, kept whole: the calling process marks itself live until now + `liveness`; the
  waiters of processes whose liveness ran out are dropped (their wake-ups would reach no one).
  Where work and waiters meet (a free session and a waiting next-available receiver, or an
  available message and a waiting receiver) a wake-up was lost (a process died after being
  picked, a subscription was interrupted): up to `repair` more waiters are woken.

  Invariant: running it again (or on another process at once) finds nothing more to do
  until time passes: every item it handles leaves the index it was found in.

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] the calling process's id
    ARGV[c+2] liveness ms: how long the process counts as live without another sweep
    ARGV[c+3] repair: most waiters to wake per kind of waiter
    ARGV[c+4] SessionIdleTimeToLive ms ('' never)

  Output:
    { expired message locks, expired messages, activated scheduled messages,
      expired idle sessions, session id whose lock expired, ... }

  Events:
    wake-ups (includes/wakeWaiters.lua) when messages or sessions became available
]]
--- @include "queueContext"
--- @include "housekeeping"
--- @include "expireMessageLocks"
--- @include "wakeWaiters"
--- @include "expireIdleSessions"
--- @include "activateBackoff"

local Q = queueContext(0, 0)
local sids = housekeeping(Q, Q.q, true)
if not Q.bo then activateBackoff(Q, Q.budget, '+inf') end
expireMessageLocks(Q, Q.d, Q.budget)
local idle = 0
local idleTtl = ARGV[QUEUE_ARGC + 4]
if idleTtl ~= '' then idle = expireIdleSessions(Q, tonumber(idleTtl), Q.budget) end

local kinds = { { Q.sfree, Q.swaiters }, { Q.q.ready, Q.q.waiters }, { Q.d.ready, Q.d.waiters } }
redis.call('ZADD', Q.procs, Q.now + tonumber(ARGV[QUEUE_ARGC + 2]), ARGV[QUEUE_ARGC + 1])
for _, proc in ipairs(redis.call('ZRANGEBYSCORE', Q.procs, '-inf', Q.now)) do
  redis.call('ZREM', Q.procs, proc)
  local prefix = proc .. ':'
  for _, kind in ipairs(kinds) do
    for _, id in ipairs(redis.call('ZRANGE', kind[2], 0, -1)) do
      if string.sub(id, 1, #prefix) == prefix then redis.call('ZREM', kind[2], id) end
    end
  end
end
local repair = tonumber(ARGV[QUEUE_ARGC + 3])
for _, kind in ipairs(kinds) do
  if redis.call('EXISTS', kind[2]) == 1 then
    wakeWaiters(Q, kind[2], math.min(redis.call('ZCARD', kind[1]), repair))
  end
end
local out = { Q.expiredLocks, Q.expiredMessages, Q.activated, idle }
for _, sid in ipairs(sids) do out[#out + 1] = sid end
return out
