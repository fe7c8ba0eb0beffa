--[[
  commitTransaction: apply every operation a transaction staged, in the order staged, or
  none of them; either way its staged state is gone afterwards.

  Operations (records as stageTransaction-2 keeps them: kind, entity, then; '' for each
  absent field):
    's' send to a queue: blob, session id, message id, time to live ms, scheduled enqueue
        time ms, reserved sequence number, as sendMessages takes them (duplicate detection
        applies now)
    'p' send to a topic (entity: the topic): blob, session id, message id, time to live ms,
        scheduled enqueue time ms, reserved sequence number, the number of placements np
        (-1: every subscription named below, unchanged), then np placements of seven as
        publishMessages takes them except that the first field is the subscription's name:
        the copies its rules decided when the send was staged. A subscription no longer live
        (or not named below: deleted since) gets nothing; numbering, copies and wake-ups are
        publishMessages' (includes/fanOutMessage.lua), duplicate detection is the topic's
    'x' settle: 'q' or 'd', lock token, outcome, session id, dead-letter reason,
        dead-letter description, properties patch, holder, as settleMessages takes them
    't' session state: session id, holder, '1' set or '0' clear, state
    'c' cancel a scheduled message (entity: a queue, or a topic: every subscription's copy):
        sequence number
  Every settlement, session state and cancellation is checked first (a live lock held by its
  holder; a message still scheduled); a failing check refuses the whole transaction.

  Invariant: all or nothing: a refused commit changes nothing but dropping the staged state.
  A transaction past its time is refused. A message settled in a transaction stays locked
  (its lock held to the transaction's time, lua/renewMessageLocks.lua) until the commit.

  Context: transaction

  Input:
    KEYS      the via entity's staged transactions (txns, txops), then one queue context
              (its key, busd.storage.keys.context_key) per queue-like entity in the order of
              ARGV, then per topic its topic context (TOPIC_KEYS, then one queue context per
              subscription)
              (built by the store: the loader knows the via entity's keys only)
    ARGV[1]   transaction id
    ARGV[2]   number of queue-like entities (queues, subscriptions) the transaction names
    then c+2 per such entity: its c queue context parameters (includes/queueContext.lua),
              its duplicate detection window ms (0: off), '1' when it requires sessions
    then      the number of topics it sends to or cancels on; per topic, as publishMessages
              takes them: its name, its number of subscriptions m, c queue context
              parameters per subscription (its own name first), the topic's duplicate
              detection window ms (0: off), then two per subscription: '1' when it requires
              sessions, its default time to live ms ('' unbounded)

  Output:
    {0, number of operations} applied;
    {status, index of the refused operation}: -1 MESSAGE_LOCK_LOST, -2 SESSION_LOCK_LOST,
    -4 MESSAGE_NOT_FOUND, -10 unknown entity; {-11}: TRANSACTION_TIMEOUT, past its time or
    gone (swept)

  Events:
    wake-ups (includes/wakeWaiters.lua) when a message became available (sends, copies,
    abandon, release, dead-letter)
]]
--- @include "queueContext"
--- @include "topicContext"
--- @include "transactionKeys"
--- @include "checkSettlement"
--- @include "applySettlement"
--- @include "enqueueMessage"
--- @include "placeMessage"
--- @include "topicSubscriptions"
--- @include "fanOutMessage"
--- @include "sessionLockedUntil"
--- @include "writeSessionState"
--- @include "deleteMessage"
--- @include "readMeta"
--- @include "countEvent"
--- @include "dropStaged"

local T = transactionKeys(0)
local txn = ARGV[1]
local woken = {} -- one wake-up per waiter for the whole commit

-- entity name -> { Q = its context, window = ms, sessionQueue = bool }
local entities = {}
local kb, ab = 2, 2
for _ = 1, tonumber(ARGV[2]) do
  local Q = queueContext(kb, ab)
  Q.woken = woken
  entities[Q.queue] = { Q = Q, window = tonumber(ARGV[ab + QUEUE_ARGC + 1]),
                        sessionQueue = ARGV[ab + QUEUE_ARGC + 2] == '1' }
  kb, ab = kb + QUEUE_KEYC, ab + QUEUE_ARGC + 2
end
-- topic name -> { T = its context, subs = its subscriptions' contexts, window, by name, ... }
local topics = {}
local nt = tonumber(ARGV[ab + 1])
ab = ab + 1
for _ = 1, nt do
  local tc = topicContext(kb, ab)
  local b = tc.rest + 1
  local t = { T = tc, subs = topicSubscriptions(tc, kb, ab, b), byName = {},
              window = tonumber(ARGV[b]), accepted = 0, duplicates = 0, dropped = 0 }
  for s, Q in ipairs(t.subs) do
    Q.woken = woken
    t.byName[Q.queue] = s
  end
  t.pick = function(name) return t.byName[name] end
  topics[tc.topic] = t
  kb, ab = kb + TOPIC_KEYC + QUEUE_KEYC * tc.n, b + 2 * tc.n
end

local function drop()
  dropStaged(T.txns, T.txops, txn)
end

local due = redis.call('ZSCORE', T.txns, txn)
if not due or tonumber(due) <= nowMs() then
  drop()
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
  local kind = op[1]
  local e, t = entities[op[2]], topics[op[2]]
  if not e and not ((kind == 'p' or kind == 'c') and t) then
    drop()
    return { -10, i }
  end
  local status = 0
  if kind == 'x' then
    local Q = e.Q
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
    if not sessionLockedUntil(e.Q, op[3], orFalse(op[4])) then status = -2 end
  elseif kind == 'c' then
    local seq = tonumber(op[3])
    local seen = op[2] .. ':' .. op[3]
    local found = {}
    if not settled[seen] then
      for _, Q in ipairs(e and { e.Q } or t.subs) do
        local m = readMeta(Q.q, seq)
        if m and m.st == 's' then found[#found + 1] = { Q, m } end
      end
    end
    settled[seen] = true
    if #found == 0 then status = -4 end
    checked[i] = found
  end
  if status ~= 0 then
    drop()
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
for _, t in pairs(topics) do
  if t.window > 0 then
    redis.call('ZREMRANGEBYSCORE', t.T.dedup, '-inf', t.T.now - t.window)
  end
end
for i, op in ipairs(ops) do
  local kind = op[1]
  if kind == 's' then
    local e = entities[op[2]]
    local Q = e.Q
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
  elseif kind == 'p' then
    local t = topics[op[2]]
    local mid = op[5]
    if t.window > 0 and mid ~= '' and redis.call('ZSCORE', t.T.dedup, mid) then
      t.duplicates = t.duplicates + 1
    else
      if t.window > 0 and mid ~= '' then redis.call('ZADD', t.T.dedup, t.T.now, mid) end
      local _, placed = fanOutMessage(t.T, t.subs, op[3], orFalse(op[4]) or nil,
        tonumber(op[6]), tonumber(op[7]), tonumber(op[9]), 10, nil, tonumber(op[8]), op, t.pick)
      t.accepted = t.accepted + 1
      if placed == 0 then t.dropped = t.dropped + 1 end
    end
  elseif kind == 'x' then
    local Q = entities[op[2]].Q
    local E, seq, m = checked[i][1], checked[i][2], checked[i][3]
    Q.caller = orFalse(op[10])
    local event = applySettlement(Q, E, seq, m, op[5], orFalse(op[7]) or nil,
      orFalse(op[8]) or nil, orFalse(op[9]))
    if event then countEvent(Q, E, event, 1) end
  elseif kind == 't' then
    local Q = entities[op[2]].Q
    writeSessionState(Q, op[3], op[5] == '1' and op[6])
  elseif kind == 'c' then
    for _, f in ipairs(checked[i]) do
      deleteMessage(f[1], f[1].q, tonumber(op[3]), f[2])
    end
  end
end
for _, e in pairs(entities) do
  for _, sid in ipairs(e.Q.emptied) do forgetSessionIfEmpty(e.Q, sid) end
end
for _, t in pairs(topics) do
  for _, Q in ipairs(t.subs) do countEvent(Q, Q.q, 'sent', Q.sent) end
  if t.accepted > 0 then redis.call('HINCRBY', t.T.tstats, 'sent', t.accepted) end
  if t.duplicates > 0 then redis.call('HINCRBY', t.T.tstats, 'duplicates', t.duplicates) end
  if t.dropped > 0 then redis.call('HINCRBY', t.T.tstats, 'dropped', t.dropped) end
end
drop()
return { 0, n }
