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
    KEYS, ARGV[1..6]  the queue context (includes/queueContext.lua)
    ARGV[7]   skip
    ARGV[8]   top
    ARGV[9]   updated after ms ('' any)

  Output:
    array of session ids

  Events:
    wake-ups (includes/wakeWaiters.lua) when housekeeping made messages or sessions available
]]
--- @include "queueContext"
--- @include "housekeeping"

local Q = queueContext(0, 0)
local skip = tonumber(ARGV[7])
local top = tonumber(ARGV[8])
housekeeping(Q, Q.q)
if top <= 0 then return {} end

if ARGV[9] == '' then
  return redis.call('ZRANGE', Q.sessions, skip, skip + top - 1)
end
return redis.call('ZRANGEBYSCORE', Q.supdated, '(' .. ARGV[9], '+inf', 'LIMIT', skip, top)
