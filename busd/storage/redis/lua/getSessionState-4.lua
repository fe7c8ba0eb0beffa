--[[
  getSessionState: read a session's state and its etag, for its live holder only, or for an
  operator (no holder: the management API's read, docs/management.md).

  Invariant: changes nothing.

  Input:
    KEYS[1]  sholder    session id -> holder of its lock
    KEYS[2]  slocks     session id -> ms its lock ends
    KEYS[3]  sstate     session id -> state
    KEYS[4]  supdated   session id -> ms its state was last set (the state's etag)
    ARGV[1]  holder ('' an operator: no lock needed)
    ARGV[2]  session id

  Output:
    { 0, state or null, etag or null (no state) }
    { -2 } SESSION_LOCK_LOST

  Events:
    none
]]
--- @include "nowMs"
--- @include "sessionLockedUntil"
--- @include "sessionStateEtag"

local Q = { sholder = KEYS[1], slocks = KEYS[2], sstate = KEYS[3], supdated = KEYS[4],
            now = nowMs() }
local sid = ARGV[2]
if ARGV[1] ~= '' and not sessionLockedUntil(Q, sid, ARGV[1]) then return { -2 } end
return { 0, redis.call('HGET', Q.sstate, sid), sessionStateEtag(Q, sid) }
