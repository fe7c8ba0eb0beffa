--[[
  dropQueue: delete a queue's every key: messages of the queue and its dead-letter sub-queue,
  sessions, session state and locks, waiters, duplicate-detection ids, totals and the sequence
  counter. The queue's catalog record is gone first (busd.storage.api Store.drop_queue), so
  no process routes to it any more; a process that still does recreates keys that a later
  drop removes.

  Invariant: after it, no key of the queue's hash tag is left.

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)

  Output:
    the number of messages deleted (queue and dead-letter sub-queue)

  Events:
    none (receivers still attached are detached by the broker, which deleted the record)
]]
--- @include "queueContext"
--- @include "messageCount"

local Q = queueContext(0, 0)
local n = messageCount(Q.q) + messageCount(Q.d)
for name, key in pairs(getmetatable(Q).__index) do -- its keys (includes/queueKeys.lua)
  if type(key) == 'table' then
    for sub, k in pairs(key) do
      if sub ~= 'dlq' then redis.call('UNLINK', k) end
    end
  elseif type(key) == 'string' and string.sub(key, 1, 1) == '{' then
    redis.call('UNLINK', key)
  end
end
return n
