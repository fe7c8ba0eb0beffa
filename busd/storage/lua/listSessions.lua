--[[
  listSessions: a page of session ids. Without a time: every session with messages or state,
  in session id order. With a time: sessions whose state was set after it, oldest update
  first.

  Invariant: the order is stable between calls (ids, or update time then id), so pages do
  not overlap while nothing changes.

  Housekeeping first (bounded): expired locks, due scheduled messages, expired messages
  (session-wide), so that listed sessions reflect expiry.

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] skip
    ARGV[c+2] top
    ARGV[c+3] updated after ms ('' any)

  Output:
    array of session ids

  Events:
    wake-ups (includes/wakeWaiters.lua) when housekeeping made messages or sessions available
]]
--- @include "queueContext"
--- @include "housekeeping"

local Q = queueContext(0, 0)
local skip = tonumber(ARGV[QUEUE_ARGC + 1])
local top = tonumber(ARGV[QUEUE_ARGC + 2])
housekeeping(Q, Q.q)
if top <= 0 then return {} end

local after = ARGV[QUEUE_ARGC + 3]
if after == '' then
  return redis.call('ZRANGE', Q.sessions, skip, skip + top - 1)
end
return redis.call('ZRANGEBYSCORE', Q.supdated, '(' .. after, '+inf', 'LIMIT', skip, top)
