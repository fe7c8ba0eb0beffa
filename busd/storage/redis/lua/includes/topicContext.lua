--- @include "nowMs"
--- @include "queueContext"
-- The number of a topic context's own keys and parameters below (busd/storage/keys.py
-- TOPIC_KEYS; the loader checks it against them). Its subscription contexts follow them:
-- the i-th one's keys start at KEYS[kb + TOPIC_KEYC + (i-1) * QUEUE_KEYC + 1], its parameters
-- at ARGV[ab + TOPIC_ARGC + (i-1) * QUEUE_ARGC + 1], and a script's own arguments after all
-- of them at ARGV[T.rest + 1].
local TOPIC_KEYC = 4
local TOPIC_ARGC = 2
-- A topic's context: its own keys (KEYS[kb+1 .. kb+TOPIC_KEYC], the order of
-- busd/storage/keys.py TOPIC_KEYS, expanded by the loader wherever a header says
-- `Context: topic`), followed by one queue context per subscription the call names
-- (QUEUE_KEYC keys each, includes/queueContext.lua; see includes/topicSubscriptions.lua). The
-- topic's sequence counter and duplicate-detection ids are also the `seq` and `dedup` of each
-- subscription context: copies keep the topic's numbers.
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
  T.rest = ab + TOPIC_ARGC + QUEUE_ARGC * T.n
  return T
end
