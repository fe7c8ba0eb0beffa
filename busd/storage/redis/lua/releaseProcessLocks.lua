--[[
  releaseProcessLocks: a broker process is known to be gone (its parent saw it die,
  busd/server/workers.py): every session lock it held on the queue ends now, as if it had expired,
  instead of when it runs out. Its ids (process id, waiters and holders
  `<process id>:<n>`) all start with one prefix: `<process id>:` names one process, and a
  worker's parent, which gives every store of the worker a process id starting with the
  worker's own prefix, names them all with that.

  Each lock ends as an expired one does (includes/expireSessionLocks.lua): the session's
  delivered, unsettled messages are available again with a counted failed attempt
  (dead-lettered at MaxDeliveryCount), first in the session's order, and the session is free
  for the next acceptor. The process's waiters are dropped, as the sweep drops those of a
  process whose liveness ran out, and its liveness entry with them. Plain message locks carry
  no holder: a worker's are found by the tag of their tokens
  (lua/releaseProcessMessageLocks.lua).

  The sessions are walked with HSCAN over sholder, at most `budget` entries a call: the
  caller repeats with the returned cursor until it is '0'. Locks taken after the walk began
  belong to live processes and are never touched.

  Invariant: only locks whose holder starts with the prefix end; a session has at most one
  holder, and a held session is not in sfree; no message is lost or reordered.

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] the prefix of the gone process's ids (not empty)
    ARGV[c+2] HSCAN cursor over sholder ('0' to start: the waiters are dropped then)

  Output:
    { next cursor ('0': done), session locks released }

  Events:
    wake-ups (includes/wakeWaiters.lua) when sessions became free, and for work that was
    waiting while a dropped waiter may have been sent its wake-up
]]
--- @include "queueContext"
--- @include "unlockSession"
--- @include "countEvent"
--- @include "wakeWaiters"

local Q = queueContext(0, 0)
local prefix = ARGV[QUEUE_ARGC + 1]
local cursor = ARGV[QUEUE_ARGC + 2]
if prefix == '' then return redis.error_reply('releaseProcessLocks: an empty prefix') end

local function ours(id)
  return string.sub(id, 1, #prefix) == prefix
end

if cursor == '0' then
  for _, proc in ipairs(redis.call('ZRANGE', Q.procs, 0, -1)) do
    if ours(proc .. ':') then redis.call('ZREM', Q.procs, proc) end
  end
  local kinds = { { Q.sfree, Q.swaiters }, { Q.q.ready, Q.q.waiters }, { Q.d.ready, Q.d.waiters } }
  for _, kind in ipairs(kinds) do
    local dropped = 0
    for _, id in ipairs(redis.call('ZRANGE', kind[2], 0, -1)) do
      if ours(id) then
        redis.call('ZREM', kind[2], id)
        dropped = dropped + 1
      end
    end
    -- A wake-up may have been spent on a dropped waiter: pass it on while work waits.
    if dropped > 0 then
      wakeWaiters(Q, kind[2], math.min(redis.call('ZCARD', kind[1]), dropped))
    end
  end
end

local scan = redis.call('HSCAN', Q.sholder, cursor, 'COUNT', Q.budget)
local released = 0
local entries = scan[2]
for i = 1, #entries, 2 do
  local sid, holder = entries[i], entries[i + 1]
  -- HSCAN may return an entry twice; the second time it is gone or another holder's.
  if ours(holder) and redis.call('HGET', Q.sholder, sid) == holder then
    unlockSession(Q, sid, true)
    released = released + 1
  end
end
countEvent(Q, Q.q, 'sessionlockexpired', released)
return { scan[1], released }
