--[[
  cancelTopicScheduled: cancel messages scheduled on a topic, by the sequence numbers the
  topic gave them: every subscription's copy still scheduled goes. All or none: when a
  number has no scheduled copy in any subscription (never scheduled, already due, or taken
  by no subscription), nothing changes.

  Invariant: a cancelled message leaves no copy in any subscription.

  Context: topic

  Input:
    KEYS, ARGV[1..2+cn]  the topic context, with a queue context of c parameters for each of
              its n subscriptions (includes/topicContext.lua)
    ARGV[3+cn..]  sequence numbers

  Output:
    0, or -4 (MESSAGE_NOT_FOUND) when a number has no scheduled copy

  Events:
    none
]]
--- @include "topicContext"
--- @include "queueContext"
--- @include "readMeta"
--- @include "deleteMessage"

local T = topicContext()
local subs = {}
for s = 1, T.n do
  subs[s] = queueContext(TOPIC_KEYC + (s - 1) * QUEUE_KEYC, TOPIC_ARGC + (s - 1) * QUEUE_ARGC)
end
local found, seen = {}, {}
for i = T.rest + 1, #ARGV do
  local seq = tonumber(ARGV[i])
  if not seen[seq] then
    seen[seq] = true
    local any = false
    for _, Q in ipairs(subs) do
      local m = readMeta(Q.q, seq)
      if m and m.st == 's' then
        any = true
        found[#found + 1] = { Q, seq, m }
      end
    end
    if not any then return -4 end
  end
end
for _, f in ipairs(found) do deleteMessage(f[1], f[1].q, f[2], f[3]) end
return 0
