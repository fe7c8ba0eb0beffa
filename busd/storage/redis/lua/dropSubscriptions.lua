--[[
  dropSubscriptions: delete subscriptions of a topic with every key they own (messages of the
  subscription and its dead-letter sub-queue, sessions, state, locks, waiters, totals) and
  take them off the topic's live subscriptions, so a fan-out that still names them stores
  nothing there. With the flag, the topic's own keys go too (the topic is deleted).

  Invariant: a subscription not in `subs` owns no key; the topic's sequence counter stays
  while the topic exists (numbers are never reused).

  Context: topic

  Input:
    KEYS, ARGV[1..2+cn]  the topic context, with a queue context of c parameters for each of
              its n subscriptions (includes/topicContext.lua; the name is the subscription's
              own name)
    ARGV[3+cn]  '1' to delete the topic's own keys as well

  Output:
    the number of messages deleted

  Events:
    none (receivers still attached are detached by the broker, which deleted the record)
]]
--- @include "topicContext"
--- @include "queueContext"
--- @include "messageCount"

local T = topicContext()
local n = 0
for i = 1, T.n do
  local Q = queueContext(TOPIC_KEYC + (i - 1) * QUEUE_KEYC, TOPIC_ARGC + (i - 1) * QUEUE_ARGC)
  n = n + messageCount(Q.q) + messageCount(Q.d)
  for name, key in pairs(getmetatable(Q).__index) do -- its keys (includes/queueKeys.lua)
    if type(key) == 'table' then
      for sub, k in pairs(key) do
        if sub ~= 'dlq' then redis.call('UNLINK', k) end
      end
    elseif type(key) == 'string' and string.sub(key, 1, 1) == '{'
        and key ~= T.seq and key ~= T.dedup then
      redis.call('UNLINK', key)
    end
  end
  redis.call('SREM', T.subs, Q.queue)
end
if ARGV[T.rest + 1] == '1' then
  redis.call('UNLINK', T.seq, T.dedup, T.subs, T.tstats)
end
return n
