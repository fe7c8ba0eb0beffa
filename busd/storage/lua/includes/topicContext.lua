--- @include "nowMs"
-- A topic's context: its own keys (KEYS[1..4], the order of busd/storage/keys.py TOPIC_KEYS,
-- expanded by the loader wherever a header says `Context: topic`), followed by one queue
-- context per subscription the call names (SUBSCRIPTION_KEYS keys each; see
-- subscriptionContext). The topic's sequence counter and duplicate-detection ids are also the
-- `seq` and `dedup` of each subscription context: copies keep the topic's numbers.
--   ARGV[1]  topic name
--   ARGV[2]  number of subscriptions the call names
local function topicContext()
  local T = {
    seq = KEYS[1], dedup = KEYS[2], subs = KEYS[3], tstats = KEYS[4],
    topic = ARGV[1], n = tonumber(ARGV[2]), now = nowMs(),
  }
  return T
end
