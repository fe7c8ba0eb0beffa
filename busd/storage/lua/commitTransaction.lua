--[[
  commitTransaction: apply every operation a transaction staged, in the order staged, or
  none of them; either way its staged state is gone afterwards.

  Operations (ten fields each, as stageTransaction-2 keeps them: kind, entity, then):
    's' send: blob, session id, message id, time to live ms, scheduled enqueue time ms,
        reserved sequence number ('' for each absent one), as sendMessages takes them
        (duplicate detection applies now)
    'x' settle: 'q' or 'd', lock token, outcome, session id, dead-letter reason,
        dead-letter description, properties patch, holder ('' for each absent one), as
        settleMessages takes them
    't' session state: session id, holder, '1' set or '0' clear, state
    'c' cancel a scheduled message: sequence number
  Every settlement, session state and cancellation is checked first (a live lock held by its
  holder; a message still scheduled); a failing check refuses the whole transaction.

  Invariant: all or nothing: a refused commit changes nothing but dropping the staged state.
  A transaction past its time is refused. A message settled in a transaction stays locked
  (its lock may still expire) until the commit.

  Context: transaction

  Input:
    KEYS      the via entity's queue context, then its staged transactions (txns, txops),
              then one further queue context (busd.storage.keys.QUEUE_KEYS) per further
              entity, in the order of ARGV[12..] (built by the store: the loader knows the
              via entity's keys only)
    ARGV[1..6]  the via entity's queue context parameters (includes/queueContext.lua)
    ARGV[7]   transaction id
    ARGV[8]   keys per queue context
    ARGV[9]   number of further entities
    ARGV[10]  the via entity's duplicate detection window ms (0: off)
    ARGV[11]  '1' when the via entity requires sessions
    ARGV[12..] eight per further entity: its six queue context parameters, its duplicate
              detection window ms, '1' when it requires sessions

  Output:
    {0, number of operations} applied;
    {status, index of the refused operation}: -1 MESSAGE_LOCK_LOST, -2 SESSION_LOCK_LOST,
    -4 MESSAGE_NOT_FOUND, -10 unknown entity; {-11}: TRANSACTION_TIMEOUT, past its time or
    gone (swept)

  Events:
    wake-ups (includes/wakeWaiters.lua) when a message became available (sends, abandon,
    release, dead-letter)
]]
--- @include "queueContext"
--- @include "transactionKeys"
--- @include "checkSettlement"
--- @include "applySettlement"
--- @include "enqueueMessage"
--- @include "placeMessage"
--- @include "sessionLockedUntil"
--- @include "writeSessionState"
--- @include "deleteMessage"
--- @include "readMeta"
--- @include "countEvent"
--- @include "dropStaged"

local via = queueContext(0, 0)
local ctx = tonumber(ARGV[8])
local T = transactionKeys(ctx)
local txn = ARGV[7]

-- entity name -> { Q = its context, window = ms, sessionQueue = bool }
local entities = {}
entities[via.queue] = { Q = via, window = tonumber(ARGV[10]), sessionQueue = ARGV[11] == '1' }
for i = 1, tonumber(ARGV[9]) do
  local ab = 11 + 8 * (i - 1)
  local Q = queueContext(ctx + 2 + ctx * (i - 1), ab)
  Q.woken = via.woken -- one wake-up per waiter for the whole commit
  entities[Q.queue] = { Q = Q, window = tonumber(ARGV[ab + 7]),
                        sessionQueue = ARGV[ab + 8] == '1' }
end

local due = redis.call('ZSCORE', T.txns, txn)
if not due or tonumber(due) <= via.now then
  dropStaged(T.txns, T.txops, txn)
  return { -11 }
end

local function orFalse(s)
  if s == '' then return false end
  return s
end

local n = tonumber(redis.call('HGET', T.txops, txn .. ':n') or '0')
local ops = {}
for i = 1, n do ops[i] = cmsgpack.unpack(redis.call('HGET', T.txops, txn .. ':' .. i)) end

-- 1. check: nothing is written until every operation is known to apply
local checked = {}
local locks = {}
local settled = {}
for i, op in ipairs(ops) do
  local kind, e = op[1], entities[op[2]]
  if not e then
    dropStaged(T.txns, T.txops, txn)
    return { -10, i }
  end
  local Q = e.Q
  local status = 0
  if kind == 'x' then
    local E = Q[op[3]]
    local token = op[4]
    local seen = op[2] .. op[3] .. token
    if settled[seen] then
      status = -1 -- settled twice in one transaction: the second finds no lock
    else
      settled[seen] = true
      local seq, m
      status, seq, m = checkSettlement(Q, E, locks, orFalse(op[10]), token, orFalse(op[6]))
      checked[i] = { E, seq, m }
    end
  elseif kind == 't' then
    if not sessionLockedUntil(Q, op[3], orFalse(op[4])) then status = -2 end
  elseif kind == 'c' then
    local m = readMeta(Q.q, tonumber(op[3]))
    if not m or m.st ~= 's' or settled[op[2] .. ':' .. op[3]] then status = -4 end
    settled[op[2] .. ':' .. op[3]] = true
    checked[i] = m
  end
  if status ~= 0 then
    dropStaged(T.txns, T.txops, txn)
    return { status, i }
  end
end

-- 2. apply, in the order staged
for _, e in pairs(entities) do
  e.Q.emptied = {}
  if e.window > 0 then
    redis.call('ZREMRANGEBYSCORE', e.Q.dedup, '-inf', e.Q.now - e.window)
  end
end
for i, op in ipairs(ops) do
  local kind, e = op[1], entities[op[2]]
  local Q = e.Q
  if kind == 's' then
    local mid = op[5]
    if e.window > 0 and mid ~= '' and redis.call('ZSCORE', Q.dedup, mid) then
      countEvent(Q, Q.q, 'duplicates', 1)
    else
      if e.window > 0 and mid ~= '' then redis.call('ZADD', Q.dedup, Q.now, mid) end
      local sid, ttl, due = orFalse(op[4]) or nil, tonumber(op[6]), tonumber(op[7])
      local reserved = tonumber(op[8])
      if reserved then
        placeMessage(Q, reserved, op[3], sid, ttl, due, e.sessionQueue)
      else
        enqueueMessage(Q, op[3], sid, ttl, due, e.sessionQueue)
      end
      countEvent(Q, Q.q, 'sent', 1)
    end
  elseif kind == 'x' then
    local E, seq, m = checked[i][1], checked[i][2], checked[i][3]
    Q.caller = orFalse(op[10])
    local event = applySettlement(Q, E, seq, m, op[5], orFalse(op[7]) or nil,
      orFalse(op[8]) or nil, orFalse(op[9]))
    if event then countEvent(Q, E, event, 1) end
  elseif kind == 't' then
    writeSessionState(Q, op[3], op[5] == '1' and op[6])
  elseif kind == 'c' then
    deleteMessage(Q, Q.q, tonumber(op[3]), checked[i])
  end
end
for _, e in pairs(entities) do
  for _, sid in ipairs(e.Q.emptied) do forgetSessionIfEmpty(e.Q, sid) end
end
dropStaged(T.txns, T.txops, txn)
return { 0, n }
