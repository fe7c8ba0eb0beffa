--[[
  renewSessionLock: extend a session lock by LockDuration from now.

  Invariant: only the live holder extends its lock.

  Input:
    KEYS[1]  sholder    session id -> holder of its lock
    KEYS[2]  slocks     session id -> ms its lock ends
    ARGV[1]  holder
    ARGV[2]  session id
    ARGV[3]  lock duration ms

  Output:
    the new locked-until ms
    -2 SESSION_LOCK_LOST: the holder holds no live lock on the session

  Events:
    none
]]
--- @include "nowMs"

local now = nowMs()
if redis.call('HGET', KEYS[1], ARGV[2]) ~= ARGV[1] then return -2 end
local current = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[2]))
if not current or current <= now then return -2 end
local lockedUntil = now + tonumber(ARGV[3])
redis.call('ZADD', KEYS[2], lockedUntil, ARGV[2])
return lockedUntil
