--[[
  getSessionState: read a session's state, for its live holder only.

  Invariant: changes nothing.

  Input:
    KEYS[1]  sholder    session id -> holder of its lock
    KEYS[2]  slocks     session id -> ms its lock ends
    KEYS[3]  sstate     session id -> state
    ARGV[1]  holder
    ARGV[2]  session id

  Output:
    { 0, state or null }
    { -2 } SESSION_LOCK_LOST

  Events:
    none
]]
--- @include "nowMs"
--- @include "sessionLockedUntil"

local Q = { sholder = KEYS[1], slocks = KEYS[2], now = nowMs() }
if not sessionLockedUntil(Q, ARGV[2], ARGV[1]) then return { -2 } end
return { 0, redis.call('HGET', KEYS[3], ARGV[2]) }
