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
  its session's: it must be live and held by the holder (by anyone when no holder is given).

  Context: queue

  Input:
    KEYS, ARGV[1..6]  the queue context (includes/queueContext.lua)
    ARGV[7]   entity: 'q' or 'd'
    ARGV[8]   holder of the session lock ('' any)
    ARGV[9..] six per settlement: lock token, outcome ('complete', 'abandon', 'defer',
              'dead-letter', 'release'), session id ('' none), dead-letter reason ('' none),
              dead-letter description ('' none), properties patch ('' none)

  Output:
    array: per settlement 0 OK, -1 MESSAGE_LOCK_LOST, -2 SESSION_LOCK_LOST

  Events:
    wake-ups (includes/wakeWaiters.lua) when a message became available (abandon, release, dead-letter)
]]
--- @include "queueContext"
--- @include "readMeta"
--- @include "sessionLockedUntil"
--- @include "deleteMessage"
--- @include "returnMessage"
--- @include "unindexMessage"
--- @include "fileMessage"
--- @include "deadLetter"
--- @include "countEvent"

local Q = queueContext(0, 0)
local E = Q[ARGV[7]]
local holder = ARGV[8]
if holder == '' then holder = false end
Q.caller = holder
Q.emptied = {} -- sessions that may have lost their last message, looked at once at the end

local function orNil(s)
  if s == '' then return nil end
  return s
end

-- Settling changes no session lock: each session's is read once per call.
local locks = {}
local function sessionLocked(sid)
  local lockedUntil = locks[sid]
  if lockedUntil == nil then
    lockedUntil = sessionLockedUntil(Q, sid, holder)
    locks[sid] = lockedUntil
  end
  return lockedUntil
end

-- The settlement's status, before anything is written.
local function check(token, sid)
  if sid and not sessionLocked(sid) then return -2 end
  local seq = redis.call('HGET', E.tokens, token)
  if not seq then return -1 end
  seq = tonumber(seq)
  local m = readMeta(E, seq)
  if not m or m.st ~= 'l' or m.tok ~= token then return -1 end
  if m.ss then
    if sid and m.sid ~= sid then return -1 end
    if not sid and not sessionLocked(m.sid) then return -2 end
  elseif m.lu <= Q.now then
    return -1
  end
  return 0, seq, m
end

-- outcome -> the event it counts (a dead-letter of the queue is counted by deadLetter)
local outcomes = { complete = 'completed', abandon = 'abandoned', release = 'released',
                   defer = 'deferred' }
outcomes['dead-letter'] = 'deadlettered'
for i = 10, #ARGV, 6 do
  if not outcomes[ARGV[i]] then return redis.error_reply('unknown outcome ' .. ARGV[i]) end
end

local out = {}
local counts = {}
for i = 9, #ARGV, 6 do
  local outcome = ARGV[i + 1]
  local status, seq, m = check(ARGV[i], orNil(ARGV[i + 2]))
  if status == 0 then
    local patch = orNil(ARGV[i + 5])
    if outcome == 'complete' then
      deleteMessage(Q, E, seq, m)
    elseif outcome == 'abandon' then
      returnMessage(Q, E, seq, m, true, patch)
    elseif outcome == 'release' then
      returnMessage(Q, E, seq, m, false, patch)
    elseif outcome == 'defer' then
      unindexMessage(Q, E, seq, m)
      if patch then m.pp = patch end
      m.st = 'd'
      m.wd = nil
      fileMessage(Q, E, seq, m)
    elseif outcome == 'dead-letter' then
      if patch then m.pp = patch end
      if E.dlq then
        unindexMessage(Q, E, seq, m)
        m.dlr = orNil(ARGV[i + 3])
        m.dld = orNil(ARGV[i + 4])
        m.st = 'a'
        m.wd = nil
        fileMessage(Q, E, seq, m)
      else
        deadLetter(Q, seq, m, orNil(ARGV[i + 3]), orNil(ARGV[i + 4]))
      end
    end
    if outcome ~= 'dead-letter' or E.dlq then
      counts[outcome] = (counts[outcome] or 0) + 1
    end
  end
  out[#out + 1] = status
end
for _, sid in ipairs(Q.emptied) do forgetSessionIfEmpty(Q, sid) end
for _, outcome in ipairs({ 'complete', 'abandon', 'release', 'defer', 'dead-letter' }) do
  countEvent(Q, E, outcomes[outcome], counts[outcome] or 0)
end
return out
