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

  Input:
    KEYS[1]   seq         last sequence number given out (queue and DLQ)
    KEYS[2]   dedup       message-id -> ms first seen (duplicate detection)
    KEYS[3]   sfree       session id -> oldest available seq; free sessions
    KEYS[4]   sholder     session id -> holder of its lock
    KEYS[5]   slocks      session id -> ms its lock ends
    KEYS[6]   sstate      session id -> state
    KEYS[7]   supdated    session id -> ms its state was last set
    KEYS[8]   sessions    sessions with messages or state (lexicographic)
    KEYS[9]   q.body      queue: seq -> blob
    KEYS[10]  q.meta      queue: seq -> packed metadata (includes/readMeta.lua)
    KEYS[11]  q.all       queue: every message, by seq
    KEYS[12]  q.ready     queue: available messages not under a session, by seq
    KEYS[13]  q.locked    queue: locked messages not under a session, by lock end
    KEYS[14]  q.tokens    queue: lock token -> seq
    KEYS[15]  q.deferred  queue: deferred messages, by seq
    KEYS[16]  q.sall      queue: <sid>\0<seq16> of every message with a session id
    KEYS[17]  q.sched     queue: scheduled messages, by due ms
    KEYS[18]  q.ttl       queue: available messages with a TTL, by expiry ms
    KEYS[19]  q.sready    queue: <sid>\0<seq16> of available session messages
    KEYS[20]  q.sinflight queue: <sid>\0<seq16> of delivered, unsettled session messages
    KEYS[21]  d.body      DLQ: seq -> blob
    KEYS[22]  d.meta      DLQ: seq -> packed metadata (includes/readMeta.lua)
    KEYS[23]  d.all       DLQ: every message, by seq
    KEYS[24]  d.ready     DLQ: available messages not under a session, by seq
    KEYS[25]  d.locked    DLQ: locked messages not under a session, by lock end
    KEYS[26]  d.tokens    DLQ: lock token -> seq
    KEYS[27]  d.deferred  DLQ: deferred messages, by seq
    KEYS[28]  d.sall      DLQ: <sid>\0<seq16> of every message with a session id
    KEYS[29]  stats       queue: <entity>.<event> -> count, monotonic totals (metrics)
    ARGV[1]   queue name (published on wake-ups)
    ARGV[2]   wake-up channel
    ARGV[3]   lock duration ms
    ARGV[4]   max delivery count
    ARGV[5]   '1' to dead-letter expired messages, '0' to drop them
    ARGV[6]   housekeeping budget (items per kind of work)
    ARGV[7]   entity: 'q' or 'd'
    ARGV[8]   holder of the session lock ('' any)
    ARGV[9..] six per settlement: lock token, outcome ('complete', 'abandon', 'defer',
              'dead-letter', 'release'), session id ('' none), dead-letter reason ('' none),
              dead-letter description ('' none), properties patch ('' none)

  Output:
    array: per settlement 0 OK, -1 MESSAGE_LOCK_LOST, -2 SESSION_LOCK_LOST

  Events:
    PUBLISH ARGV[2] ARGV[1] when a message became available (abandon, release, dead-letter)
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

local Q = queueContext()
local E = Q[ARGV[7]]
local holder = ARGV[8]
if holder == '' then holder = false end

local function orNil(s)
  if s == '' then return nil end
  return s
end

-- The settlement's status, before anything is written.
local function check(token, sid)
  if sid and not sessionLockedUntil(Q, sid, holder) then return -2 end
  local seq = redis.call('HGET', E.tokens, token)
  if not seq then return -1 end
  seq = tonumber(seq)
  local m = readMeta(E, seq)
  if not m or m.st ~= 'l' or m.tok ~= token then return -1 end
  if m.ss then
    if sid and m.sid ~= sid then return -1 end
    if not sid and not sessionLockedUntil(Q, m.sid, holder) then return -2 end
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
    if outcome ~= 'dead-letter' or E.dlq then countEvent(Q, E, outcomes[outcome]) end
  end
  out[#out + 1] = status
end
return out
