--[[
  cancelScheduled: remove scheduled messages that are not due yet, all or none.

  Invariant: only messages still in the scheduled state are removed; a failing call changes
  nothing.

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1..] sequence numbers

  Output:
    0 OK
    -4 MESSAGE_NOT_FOUND: some sequence number is not (or no longer) a scheduled message

  Events:
    none
]]
--- @include "queueContext"
--- @include "readMeta"
--- @include "deleteMessage"

local Q = queueContext(0, 0)
local found, seen = {}, {}
for i = QUEUE_ARGC + 1, #ARGV do
  local seq = tonumber(ARGV[i])
  local m = readMeta(Q.q, seq)
  if not m or m.st ~= 's' then return -4 end
  if not seen[seq] then
    seen[seq] = true
    found[#found + 1] = { seq, m }
  end
end
for _, f in ipairs(found) do deleteMessage(Q, Q.q, f[1], f[2]) end
return 0
