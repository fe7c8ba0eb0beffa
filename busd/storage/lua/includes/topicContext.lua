--- @include "nowMs"
-- A topic's context: its own keys (KEYS[1..4], the order of busd/storage/keys.py TOPIC_KEYS,
-- expanded by the loader wherever a header says `Context: topic`), followed by one queue
-- context per subscription the call names (QUEUE_KEYC keys each, includes/queueContext.lua;
-- see includes/topicSubscriptions.lua). The topic's sequence counter and duplicate-detection
-- ids are also the `seq` and `dedup` of each subscription context: copies keep the topic's
-- numbers.
--   ARGV[ab+1]  topic name
--   ARGV[ab+2]  number of subscriptions the call names
-- The offsets (0 when absent) let a script hold it after other contexts (the destination of
-- lua/forwardMessages.lua).
local function topicContext(kb, ab)
  kb = kb or 0
  ab = ab or 0
  local T = {
    seq = KEYS[kb + 1], dedup = KEYS[kb + 2], subs = KEYS[kb + 3], tstats = KEYS[kb + 4],
    topic = ARGV[ab + 1], n = tonumber(ARGV[ab + 2]), now = nowMs(),
  }
  return T
end
