--[[
  sessionInfos: every session with messages or state, with what tools show about it.
  Reads only.

  Invariant: changes nothing.

  Input:
    KEYS[1]  sessions   sessions with messages or state
    KEYS[2]  q.sall     <sid>\0<seq16> of every message of the queue with a session id
    KEYS[3]  sholder    session id -> holder of its lock
    KEYS[4]  slocks     session id -> ms its lock ends
    KEYS[5]  sstate     session id -> state
    KEYS[6]  supdated   session id -> ms its state was last set

  Output:
    array of { session id, message count, locked-until ms or null (none, or expired),
               state size in bytes, ms state last set (0 never) }

  Events:
    none
]]
--- @include "nowMs"
--- @include "sessionRange"

local now = nowMs()
local out = {}
for _, sid in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local lo, hi = sessionRange(sid)
  local lockedUntil = false
  if redis.call('HEXISTS', KEYS[3], sid) == 1 then
    local lu = tonumber(redis.call('ZSCORE', KEYS[4], sid))
    if lu and lu > now then lockedUntil = lu end
  end
  out[#out + 1] = {
    sid,
    redis.call('ZLEXCOUNT', KEYS[2], lo, hi),
    lockedUntil,
    redis.call('HSTRLEN', KEYS[5], sid),
    tonumber(redis.call('ZSCORE', KEYS[6], sid)) or 0,
  }
end
return out
