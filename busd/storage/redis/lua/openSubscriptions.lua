--[[
  openSubscriptions: mark subscriptions of a topic live, so that fan-out stores copies in
  them (sendToTopic skips a subscription that is not live).

  Invariant: `subs` holds exactly the subscriptions whose catalog records exist (the record
  is written after this script, and deleted before dropSubscriptions).

  Context: topic

  Input:
    KEYS      the topic context (no subscription contexts: n is 0)
    ARGV[1]   topic name
    ARGV[2]   0
    ARGV[3..] subscription names

  Output:
    how many were not live before

  Events:
    none
]]
--- @include "topicContext"

local T = topicContext()
local added = 0
for i = 3, #ARGV do
  added = added + redis.call('SADD', T.subs, ARGV[i])
end
return added
