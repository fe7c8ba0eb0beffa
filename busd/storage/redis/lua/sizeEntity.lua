--[[
  sizeEntity: the bytes of the messages a queue (or subscription) holds, its dead-letter
  sub-queue's included: what the management API answers as SizeInBytes. Reads only.

  Exact up to 2 * ARGV[c+1] messages per sub-queue (and ARGV[c+1] in flight under session
  locks); past that an estimate: the mean size of the oldest and the newest ARGV[c+1]
  messages (and of ARGV[c+1] in flight) times their number. Its cost is bounded by the
  sample whatever the entity holds, so answering the management API costs no sending or
  settling script anything (docs/design.md §2.1).

  Invariant: changes nothing (no housekeeping either).

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] sample: messages read at each end of each sub-queue

  Output:
    { bytes, messages, exact (1 or 0) }

  Events:
    none
]]
--- @include "queueContext"
--- @include "memberSeq"

local Q = queueContext(0, 0)
local sample = tonumber(ARGV[QUEUE_ARGC + 1])
local bytes, messages, exact = 0, 0, 1
for _, E in ipairs({ Q.q, Q.d }) do
  -- counted by the indexes: the body hash also holds each message's metadata (includes/metaField);
  -- those in flight under a session lock are out of E.all (includes/messageCount.lua)
  local rest = redis.call('ZCARD', E.all)
  local n = rest
  if E.sinflight then n = n + redis.call('ZCARD', E.sinflight) end
  if n > 0 then
    local seqs
    if rest <= 2 * sample then
      seqs = redis.call('ZRANGE', E.all, 0, -1)
    else
      seqs = redis.call('ZRANGE', E.all, 0, sample - 1)
      for _, seq in ipairs(redis.call('ZRANGE', E.all, -sample, -1)) do
        seqs[#seqs + 1] = seq
      end
    end
    if E.sinflight then -- in flight under a session lock: out of E.all (includes/lockMessage.lua)
      for _, member in ipairs(redis.call('ZRANGE', E.sinflight, 0, sample - 1)) do
        seqs[#seqs + 1] = memberSeq(member)
      end
    end
    local sum = 0
    for _, seq in ipairs(seqs) do
      sum = sum + redis.call('HSTRLEN', E.body, seq)
    end
    if #seqs == n then
      bytes = bytes + sum
    elseif #seqs > 0 then
      bytes = bytes + math.floor(sum / #seqs * n + 0.5)
      exact = 0
    end
    messages = messages + n
  end
end
return { bytes, messages, exact }
