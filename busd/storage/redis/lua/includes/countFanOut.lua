--- @include "countEvent"
-- The totals of a batch fanned out to a topic T: each subscription's copies (Q.sent), and
-- the topic's messages sent, duplicates dropped and messages no subscription took.
local function countFanOut(T, subs, sent, duplicates, dropped)
  for s = 1, #subs do countEvent(subs[s], subs[s].q, 'sent', subs[s].sent) end
  if sent > 0 then redis.call('HINCRBY', T.tstats, 'sent', sent) end
  if duplicates > 0 then redis.call('HINCRBY', T.tstats, 'duplicates', duplicates) end
  if dropped > 0 then redis.call('HINCRBY', T.tstats, 'dropped', dropped) end
end
