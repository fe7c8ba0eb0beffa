--[[
  settleMessages: apply a batch of settlements, each by lock token, each on its own.

  complete deletes; abandon unlocks with a counted failed attempt (dead-lettered with
  MaxDeliveryCountExceeded at MaxDeliveryCount; it is then the next one delivered, in its
  session too); defer unlocks into the deferred state (only receiveDeferred reaches it);
  dead-letter moves it to the dead-letter sub-queue with reason and description (in the
  dead-letter sub-queue itself it stays there, unlocked, with the new reason and description);
  release unlocks without counting an attempt. A properties patch, when given, is kept and
  handed back with later deliveries.

  Invariant: a settlement whose lock is not live changes nothing. A session message's lock is
  its session's: it must be live and held by the settlement's holder (by anyone when it names
  none). The settlements of several receivers come in one call (busd/storage/redis/coalesce.py),
  each with its own holder, each applied as if alone.

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] entity: 'q' or 'd'
    ARGV[c+2..] seven per settlement: lock token, outcome ('complete', 'abandon', 'defer',
              'dead-letter', 'release'), session id ('' none), dead-letter reason ('' none),
              dead-letter description ('' none), properties patch ('' none), holder of the
              session lock ('' any)

  Output:
    array: per settlement 0 OK, -1 MESSAGE_LOCK_LOST, -2 SESSION_LOCK_LOST

  Events:
    wake-ups (includes/wakeWaiters.lua) when a message became available (abandon, release, dead-letter)
]]
--- @include "queueContext"
--- @include "checkSettlement"
--- @include "applySettlement"
--- @include "countEvent"
--- @include "noteActivity"
--- @include "flushRemovals"

local Q = queueContext(0, 0)
local E = Q[ARGV[QUEUE_ARGC + 1]]
-- A session message settles only under its session's live lock (includes/checkSettlement.lua),
-- so a session its settlements leave empty is held: it stays listed in `sessions` until its
-- lock ends, which forgets it then (includes/unlockSession.lua), instead of being forgotten
-- here and filed again by the next send, per message (docs/design.md §3.4). Listing leaves
-- out a held session without messages or state (lua/listSessions.lua).
Q.emptied = {} -- collected by includes/deleteMessage.lua, and left so

local function orNil(s)
  if s == '' then return nil end
  return s
end

local outcomes = { complete = true, abandon = true, release = true, defer = true }
outcomes['dead-letter'] = true
local completions = 0
for i = QUEUE_ARGC + 3, #ARGV, 7 do
  if not outcomes[ARGV[i]] then return redis.error_reply('unknown outcome ' .. ARGV[i]) end
  if ARGV[i] == 'complete' then completions = completions + 1 end
end

-- Completions in a row delete their messages with one removal per key for all of them
-- (includes/removeFrom.lua), in a call that has two or more (one alone gains nothing from
-- gathering, which costs the script's own work): a message completed earlier in the call is
-- still readable until then, so `completed` says it is gone (settled again, its lock is lost,
-- as it would be read). Any other outcome first makes the removals gathered so far, and runs
-- unbatched: what it reads and writes is then what it would be had each completion been made
-- alone.
local gather = completions > 1
local out = {}
local settled = {} -- sessions whose holder settled: their last activity is now
local counts = {}
local locks = {}
local completed = {}
for i = QUEUE_ARGC + 2, #ARGV, 7 do
  local holder = orNil(ARGV[i + 6]) or false
  Q.caller = holder -- its own wake-ups are not sent (includes/wakeHolder.lua)
  local sid = orNil(ARGV[i + 2]) or false
  local status, seq, m = checkSettlement(Q, E, locks, holder, ARGV[i], sid)
  if status == 0 and completed[seq] then status = -1 end
  if status == 0 then
    if sid and E == Q.q then settled[sid] = true end
    local outcome = ARGV[i + 1]
    if outcome == 'complete' then
      if gather then
        if not Q.batch then flushRemovals(Q, true) end
        completed[seq] = true
      end
    elseif Q.batch then
      flushRemovals(Q, false)
    end
    local event = applySettlement(Q, E, seq, m, outcome, orNil(ARGV[i + 3]),
      orNil(ARGV[i + 4]), orNil(ARGV[i + 5]) or false)
    if event then counts[event] = (counts[event] or 0) + 1 end
  end
  out[#out + 1] = status
end
flushRemovals(Q, false)
for sid in pairs(settled) do noteActivity(Q, sid) end
for _, event in ipairs({ 'completed', 'abandoned', 'released', 'deferred', 'deadlettered' }) do
  countEvent(Q, E, event, counts[event] or 0)
end
return out
