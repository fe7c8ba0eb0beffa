--[[
  resubmitDeadLetters: move up to `limit` dead-lettered messages back into the queue, oldest
  first: each is enqueued now with delivery count 0 and no dead-letter reason, keeps its body,
  session id and properties patch, and lives for the queue's default time to live from now
  (its own may be what expired it). On a queue without sessions each gets a new sequence
  number. On a session queue sessions move whole, as lua/resubmitSession.lua moves one
  (includes/resubmitSessionLetters.lua: each message under the sequence number it had, the
  session's state with them): the session of the oldest dead letter, then the next, until
  `limit` messages have moved; the last session moved may take the count past `limit`, as a
  session is never split (a part resubmitted now and the rest later would come back after it
  and out of order).
  Messages a dead-letter receiver holds locked stay where they are.

  Invariant: a message is in exactly one of the two entities before and after; on a session
  queue a message without a session id stays in the dead-letter sub-queue (it could never be
  received from the queue).

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] '1' when the queue requires sessions
    ARGV[c+2] the queue's default time to live ms ('' unbounded)
    ARGV[c+3] at most this many messages (on a session queue: until this many, whole sessions)

  Output:
    { moved, dead-lettered messages still available or deferred afterwards }

  Events:
    wake-ups (includes/wakeWaiters.lua) when a message became available
]]
--- @include "queueContext"
--- @include "readMeta"
--- @include "deleteMessage"
--- @include "enqueueMessage"
--- @include "resubmitSessionLetters"
--- @include "countEvent"

local Q = queueContext(0, 0)
local sessionQueue = ARGV[QUEUE_ARGC + 1] == '1'
local ttl = tonumber(ARGV[QUEUE_ARGC + 2])
local limit = tonumber(ARGV[QUEUE_ARGC + 3])
local moved = 0

if sessionQueue then
  -- Sessions in the order of their oldest dead letter: Q.d.all by sequence number, read a
  -- page at a time after the last one seen, as moving a session takes its members out.
  local after, done = '-inf', {}
  while moved < limit do
    local page = redis.call('ZRANGEBYSCORE', Q.d.all, after, '+inf', 'LIMIT', 0, 100)
    if #page == 0 then break end
    for _, s in ipairs(page) do
      after = '(' .. s
      local m = readMeta(Q.d, tonumber(s))
      if m and m.sid and not done[m.sid] and (m.st == 'a' or m.st == 'd') then
        done[m.sid] = true
        moved = moved + resubmitSessionLetters(Q, m.sid, ttl)
        if moved >= limit then break end
      end
    end
  end
else
  -- The oldest available or deferred dead-letter messages (locked ones are being handled).
  local candidates = {}
  for _, key in ipairs({ Q.d.ready, Q.d.deferred }) do
    if limit < 1 then break end
    for _, s in ipairs(redis.call('ZRANGE', key, 0, limit - 1)) do
      candidates[#candidates + 1] = tonumber(s)
    end
  end
  table.sort(candidates)
  for _, seq in ipairs(candidates) do
    if moved >= limit then break end
    local m = readMeta(Q.d, seq)
    if m and (m.st == 'a' or m.st == 'd') then
      local body = redis.call('HGET', Q.d.body, seq)
      deleteMessage(Q, Q.d, seq, m)
      enqueueMessage(Q, body, m.sid, ttl, nil, false, m.pp)
      moved = moved + 1
    end
  end
end
countEvent(Q, Q.q, 'resubmitted', moved)
return { moved, redis.call('ZCARD', Q.d.ready) + redis.call('ZCARD', Q.d.deferred) }
