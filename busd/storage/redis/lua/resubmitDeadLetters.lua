--[[
  resubmitDeadLetters: move up to `limit` dead-lettered messages back into the queue as new
  messages, oldest first: each gets a new sequence number, is enqueued now with delivery
  count 0 and no dead-letter reason, keeps its body, session id and properties patch, and
  lives for the queue's default time to live from now (its own may be what expired it).
  A session state dead-lettered with the message (lua/deadLetterSession.lua) comes back
  unless the session has one by now.
  Messages a dead-letter receiver holds locked stay where they are.

  Invariant: a message is in exactly one of the two entities before and after; on a session
  queue a message without a session id stays in the dead-letter sub-queue (it could never be
  received from the queue).

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] '1' when the queue requires sessions
    ARGV[c+2] the queue's default time to live ms ('' unbounded)
    ARGV[c+3] at most this many messages

  Output:
    { moved, dead-lettered messages still available or deferred afterwards }

  Events:
    wake-ups (includes/wakeWaiters.lua) when a message became available
]]
--- @include "queueContext"
--- @include "readMeta"
--- @include "deleteMessage"
--- @include "enqueueMessage"
--- @include "writeSessionState"
--- @include "countEvent"

local Q = queueContext(0, 0)
local sessionQueue = ARGV[QUEUE_ARGC + 1] == '1'
local ttl = tonumber(ARGV[QUEUE_ARGC + 2])
local limit = tonumber(ARGV[QUEUE_ARGC + 3])

-- The oldest available or deferred dead-letter messages (locked ones are being handled).
local candidates = {}
for _, key in ipairs({ Q.d.ready, Q.d.deferred }) do
  if limit < 1 then break end
  for _, s in ipairs(redis.call('ZRANGE', key, 0, limit - 1)) do
    candidates[#candidates + 1] = tonumber(s)
  end
end
table.sort(candidates)

local moved = 0
for _, seq in ipairs(candidates) do
  if moved >= limit then break end
  local m = readMeta(Q.d, seq)
  if m and (m.st == 'a' or m.st == 'd') then
    if m.sid or not sessionQueue then
      local body = redis.call('HGET', Q.d.body, seq)
      deleteMessage(Q, Q.d, seq, m)
      enqueueMessage(Q, body, m.sid, ttl, nil, sessionQueue, m.pp)
      if m.sst and redis.call('HEXISTS', Q.sstate, m.sid) == 0 then
        writeSessionState(Q, m.sid, m.sst)
      end
      moved = moved + 1
    end
  end
end
countEvent(Q, Q.q, 'resubmitted', moved)
return { moved, redis.call('ZCARD', Q.d.ready) + redis.call('ZCARD', Q.d.deferred) }
