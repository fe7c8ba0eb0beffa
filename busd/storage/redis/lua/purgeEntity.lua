--[[
  purgeEntity: delete every message of an entity (the queue, or its dead-letter sub-queue).
  Purging the queue keeps session state and session locks; sessions left with neither
  messages nor state cease to exist; those left with state and no holder are idle from now.

  Invariant: sequence numbers are not reused after a purge (the counter stays), and the
  event totals stay (they only grow).

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] entity: 'q' or 'd'

  Output:
    the number of messages deleted

  Events:
    none
]]
--- @include "queueContext"
--- @include "messageCount"
--- @include "countEvent"
--- @include "noteIdleSession"
--- @include "clientField"

local Q = queueContext(0, 0)
local E = Q[ARGV[QUEUE_ARGC + 1]]
local n = messageCount(E)
for name, key in pairs(E) do
  if name ~= 'dlq' then redis.call('UNLINK', key) end
end
if not E.dlq then
  redis.call('UNLINK', Q.sfree)
  for _, sid in ipairs(redis.call('ZRANGE', Q.sessions, 0, -1)) do
    -- a held one stays while held (includes/forgetSessionIfEmpty.lua)
    if redis.call('HEXISTS', Q.sholder, sid) == 1 then
      sid = false
    end
    if sid and redis.call('HEXISTS', Q.sstate, sid) == 0 then
      redis.call('ZREM', Q.sessions, sid)
      redis.call('ZREM', Q.supdated, sid)
      redis.call('HDEL', Q.sactive, sid, clientField(sid))
    elseif sid then
      noteIdleSession(Q, sid, { stateful = true, empty = true })
    end
  end
end
countEvent(Q, E, 'purged', n)
return n
