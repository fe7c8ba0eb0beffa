--[[
  receiveMessages: deliver up to `count` available messages of an entity (the queue, or its
  dead-letter sub-queue) that are not filed under a session, oldest sequence number first.
  Peek-lock locks each for LockDuration under the caller's token; receive-and-delete deletes.

  Housekeeping first (bounded): expired message locks, and on the queue also expired session
  locks, due scheduled messages and expired messages. A message met past its time to live
  is expired, not delivered.

  A caller that got fewer than `count` is registered as a waiter of the entity in the same
  step (and taken off when it got all it asked for), so that the next message that becomes
  available wakes it (includes/fileMessage.lua) and no message can slip by unnoticed.

  Invariant: a delivered message is in exactly one of {locked, deleted}; while locked, its
  token names it (includes/lockToken.lua).

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] entity: 'q' the queue, 'd' its dead-letter sub-queue
    ARGV[c+2] receive mode: '1' peek-lock, '0' receive-and-delete
    ARGV[c+3] count
    ARGV[c+4] waiter id ('' none: do not register)
    ARGV[c+5] peek-lock: the lock tokens, 16 bytes each, one per message (at least `count`),
              as one string

  Output:
    array of delivery rows (includes/deliveryRow.lua)

  Events:
    wake-ups (includes/wakeWaiters.lua) when housekeeping made messages or sessions available
]]
--- @include "queueContext"
--- @include "housekeeping"
--- @include "readMessage"
--- @include "expireIfDue"
--- @include "takeMessage"
--- @include "tokenAt"
--- @include "countEvent"

local Q = queueContext(0, 0)
local E = Q[ARGV[QUEUE_ARGC + 1]]
local peekLock = ARGV[QUEUE_ARGC + 2] == '1'
local count = tonumber(ARGV[QUEUE_ARGC + 3])
housekeeping(Q, E)

local lockedUntil = false
if peekLock then lockedUntil = Q.now + Q.lockMs end
local out = {}
while #out < count do
  local wanted = count - #out
  local seqs = redis.call('ZRANGE', E.ready, 0, wanted - 1)
  for _, s in ipairs(seqs) do
    local seq = tonumber(s)
    local m, body = readMessage(E, seq)
    if not m or m.st ~= 'a' then
      redis.call('ZREM', E.ready, s) -- not available (cannot happen; never loop on it)
    elseif E.dlq or not expireIfDue(Q, seq, m) then
      local token = false
      if peekLock then token = tokenAt(ARGV[QUEUE_ARGC + 5], #out + 1) end
      out[#out + 1] = takeMessage(Q, E, seq, m, token, lockedUntil, body)
    end
  end
  -- fewer than asked: that was all of them (another look only replaces what was skipped)
  if #seqs < wanted then break end
end
countEvent(Q, E, 'received', #out)
local waiter = ARGV[QUEUE_ARGC + 4]
if waiter ~= '' then
  if #out < count then
    redis.call('ZADD', E.waiters, Q.now, waiter)
  else
    redis.call('ZREM', E.waiters, waiter)
  end
end
return out
