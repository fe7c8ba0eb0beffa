--- @include "lockedMessage"
--- @include "sessionLockedUntil"
-- Whether the message locked under `token` may be settled by `holder` (false: anyone), for
-- session `sid` (false: none named): 0, seq, meta; else -1 MESSAGE_LOCK_LOST or -2
-- SESSION_LOCK_LOST. Nothing is written. A session message's lock is its session's: live and
-- held by the holder. `locks` caches each session's lock end per holder for the call
-- (settling changes no session lock).
-- A session message still locked under its token was locked for the session's current
-- holder, which it names (m.h, includes/lockMessage.lua): every change of holder unlocks the
-- session's messages first (includes/unlockSession.lua). Then the lock's end is all there is
-- to read. Any other case is checked in full, in the order that picks the condition.
local function checkSettlement(Q, E, locks, holder, token, sid)
  local function sessionLocked(s)
    local key = s .. '\0' .. (holder or '')
    local lockedUntil = locks[key]
    if lockedUntil == nil then
      lockedUntil = sessionLockedUntil(Q, s, holder)
      locks[key] = lockedUntil
    end
    return lockedUntil
  end
  local seq, m = lockedMessage(E, token)
  if seq and m.ss and m.h and (not holder or m.h == holder) and (not sid or m.sid == sid) then
    local key = '\1' .. m.sid
    local lockedUntil = locks[key]
    if lockedUntil == nil then
      lockedUntil = tonumber(redis.call('ZSCORE', Q.slocks, m.sid)) or false
      locks[key] = lockedUntil
    end
    if lockedUntil and lockedUntil > Q.now then return 0, seq, m end
  end
  if sid and not sessionLocked(sid) then return -2 end
  if not seq then return -1 end
  if m.ss then
    if sid and m.sid ~= sid then return -1 end
    if not sid and not sessionLocked(m.sid) then return -2 end
  elseif m.lu <= Q.now then
    return -1
  end
  return 0, seq, m
end
