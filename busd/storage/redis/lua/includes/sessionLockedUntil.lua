-- When `holder` (false: anyone) holds a live lock on the session: the ms it ends; else false.
local function sessionLockedUntil(Q, sid, holder)
  local h = redis.call('HGET', Q.sholder, sid)
  if not h or (holder and h ~= holder) then return false end
  local lu = tonumber(redis.call('ZSCORE', Q.slocks, sid))
  if not lu or lu <= Q.now then return false end
  return lu
end
