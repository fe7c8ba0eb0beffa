--[[
  stopWaiting: a waiting receiver goes away (its link closed, or it stops waiting for a
  session). It leaves the waiters; when it was no longer among them, a wake-up may have been
  spent on it, so it is passed on: one other waiter is woken if there is work it could take.

  Invariant: no wake-up is lost to a receiver that left: work that woke one (a free session,
  an available message) wakes another while both remain.

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] waiters: 's' next-available session receivers, 'q' the queue's, 'd' the
              dead-letter sub-queue's
    ARGV[c+2] waiter id

  Output:
    1 when it was waiting, 0 when not (a wake-up was passed on if there was work)

  Events:
    wake-ups (includes/wakeWaiters.lua): at most one, when passed on
]]
--- @include "queueContext"
--- @include "wakeWaiters"

local Q = queueContext(0, 0)
local waiters, work
if ARGV[QUEUE_ARGC + 1] == 's' then
  waiters, work = Q.swaiters, Q.sfree
else
  waiters, work = Q[ARGV[QUEUE_ARGC + 1]].waiters, Q[ARGV[QUEUE_ARGC + 1]].ready
end
if redis.call('ZREM', waiters, ARGV[QUEUE_ARGC + 2]) == 1 then return 1 end
if redis.call('EXISTS', work) == 1 then wakeWaiters(Q, waiters, 1) end
return 0
