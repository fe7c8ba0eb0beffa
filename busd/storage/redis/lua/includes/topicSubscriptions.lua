--- @include "queueContext"
-- The subscription contexts of a topic context T whose keys start at KEYS[kb+1] and whose
-- parameters start at ARGV[ab+1] (includes/topicContext.lua): each subscription's queue
-- context, live or not (in `subs`), whether it requires sessions and its default time to live
-- (the two per subscription at ARGV[b+1 ..]), all on T's clock.
local function topicSubscriptions(T, kb, ab, b)
  local subs = {}
  for i = 1, T.n do
    local Q = queueContext(kb + TOPIC_KEYC + (i - 1) * QUEUE_KEYC,
                           ab + TOPIC_ARGC + (i - 1) * QUEUE_ARGC)
    Q.now = T.now  -- one clock for every copy
    Q.live = redis.call('SISMEMBER', T.subs, Q.queue) == 1
    Q.sessionQueue = ARGV[b + 2 * i - 1] == '1'
    Q.maxTtl = tonumber(ARGV[b + 2 * i])
    Q.sent = 0
    subs[i] = Q
  end
  return subs
end
