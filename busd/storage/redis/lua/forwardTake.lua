--[[
  forwardTake: a forwarder takes the next messages of the entity it forwards (the queue or
  subscription with ForwardTo, or the dead-letter sub-queue with ForwardDeadLetteredMessagesTo)
  to move them (lua/forwardMessages.lua), oldest sequence number first.

  One forwarder at a time moves an entity's messages, so that they arrive in the order they
  were received whichever busd process forwards: it holds the entity's forwarding lease from
  the call that takes a batch until the call that finds nothing left. Another forwarder meets
  the lease and waits. The lease ends with the locks of the batch taken last, so a forwarder
  whose process died leaves nothing stuck: its locks expire (the messages come back), and so
  does its lease.

  Housekeeping first (bounded), as for receiveMessages. A caller that takes nothing, or meets
  another forwarder's lease, is registered as a waiter of the entity in the same step: the
  next message that becomes available wakes it (includes/fileMessage.lua), and the sweep
  wakes it while messages wait and nobody takes them.

  A session-enabled queue or subscription forwards too (docs/design.md §2.15): its available
  messages are taken from its sessions' index as well, each session's in sequence order, and
  held by the forwarder's own lock (marked `fl`: no session lock covers them), which expires
  like any message lock and puts the message back in its session (includes/unindexMessage.lua).
  The caller then also waits among the receivers waiting for a free session, which is how a
  session message that becomes available wakes someone.

  Invariant: the lease is held by at most one forwarder; a taken message is locked under the
  caller's token until the lease's end.

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua); its lock duration is the
              forwarder's lock (and lease) duration
    ARGV[c+1] entity: 'q' the queue, 'd' its dead-letter sub-queue
    ARGV[c+2] forwarder id (a waiter id: `<process id>:<n>`)
    ARGV[c+3] count
    ARGV[c+4] the lock tokens, 16 bytes each, one per message (at least `count`), as one string

  Output:
    array: 0, then a delivery row (includes/deliveryRow.lua) per message taken, each
    followed by its hop count; or 1 alone when another forwarder holds the lease

  Events:
    wake-ups (includes/wakeWaiters.lua) when housekeeping made messages available
]]
--- @include "queueContext"
--- @include "housekeeping"
--- @include "readMeta"
--- @include "expireIfDue"
--- @include "takeMessage"
--- @include "unindexMessage"
--- @include "lockMessage"
--- @include "deliveryRow"
--- @include "memberSeq"
--- @include "seqMember"
--- @include "tokenAt"

local Q = queueContext(0, 0)
local e = ARGV[QUEUE_ARGC + 1]
local E = Q[e]
local me = ARGV[QUEUE_ARGC + 2]
local count = tonumber(ARGV[QUEUE_ARGC + 3])
housekeeping(Q, E)

local holder = redis.call('HGET', Q.fwd, e)
if holder and holder ~= me then
  local ends = tonumber(redis.call('HGET', Q.fwd, e .. '.u'))
  if ends and ends > Q.now then
    redis.call('ZADD', E.waiters, Q.now, me)
    return { 1 }
  end
end

local lockedUntil = Q.now + Q.lockMs
local out = { 0 }
local taken = 0

local function take(seq, m)
  taken = taken + 1
  local token = tokenAt(ARGV[QUEUE_ARGC + 4], taken)
  local row
  if m.ss then
    unindexMessage(Q, E, seq, m)
    -- under a plain lock it is listed with its session's deferred and scheduled ones (sall)
    -- until it is a session message again (includes/fileMessage.lua)
    if m.xs then
      redis.call('ZADD', E.sall, 0, seqMember(m.sid, seq))
      m.xs = nil
    end
    m.ss, m.fl = nil, 1
    lockMessage(Q, E, seq, m, token, lockedUntil)
    row = deliveryRow(seq, redis.call('HGET', E.body, seq), m, m.tok, lockedUntil)
  else
    row = takeMessage(Q, E, seq, m, token, lockedUntil)
  end
  row[13] = row[13] or false
  row[14] = row[14] or false
  row[15] = m.hop or 0
  out[#out + 1] = row
end

while taken < count do
  local wanted = count - taken
  local seqs = redis.call('ZRANGE', E.ready, 0, wanted - 1)
  for _, s in ipairs(seqs) do
    local seq = tonumber(s)
    local m = readMeta(E, seq)
    if not m or m.st ~= 'a' then
      redis.call('ZREM', E.ready, s)
    elseif E.dlq or not expireIfDue(Q, seq, m) then
      take(seq, m)
    end
  end
  if #seqs < wanted then break end
end
if not E.dlq and taken < count then
  -- sessions' messages: one pass (a session that expires takes its other messages along)
  for _, member in ipairs(redis.call('ZRANGE', E.sready, 0, count - taken - 1)) do
    local seq = memberSeq(member)
    local m = readMeta(E, seq)
    if not m or m.st ~= 'a' then
      redis.call('ZREM', E.sready, member)
    elseif not expireIfDue(Q, seq, m) then
      take(seq, m)
    end
  end
end
if taken == 0 then
  redis.call('HDEL', Q.fwd, e, e .. '.u')
  redis.call('ZADD', E.waiters, Q.now, me)
  if not E.dlq then redis.call('ZADD', Q.swaiters, Q.now, me) end
else
  redis.call('HSET', Q.fwd, e, me, e .. '.u', lockedUntil)
  redis.call('ZREM', E.waiters, me)
  if not E.dlq then redis.call('ZREM', Q.swaiters, me) end
end
return out
