--- @include "clientField"
-- A settle records its held session's last activity (`sactive`, the inspector's
-- `last_activity`, docs/management.md §7) at most once a second per session (once a quarter
-- of the lock duration, when that is shorter): a held session settling every message would
-- otherwise write it per message. Accepting (`always`) writes it and records it, so the
-- settles of its first second write nothing; unlocking writes it as it did. What this
-- server last wrote is remembered in a table of the library, kept between calls and lost
-- with the server (a restarted or promoted one writes at once), and dropped whole at 4096
-- sessions. So the recorded time lags by less than that interval, and a session that settles
-- more often than every three quarters of its lock duration never looks `stuck`.
-- An accept also writes its holder's connection (`client`, '<container id>\0<address>', ''
-- unknown) in the same hash and command, as field '<sid>\0c' (a session id has no NUL). It
-- is read only while the session is held (lua/sessionPage.lua), so the lock's end leaves it
-- for the next accept to overwrite, and the session's forgetting deletes it with its last
-- activity (clientField: includes/forgetSessionIfEmpty.lua, includes/expireIdleSessions.lua,
-- lua/purgeEntity.lua).
local ACTIVITY_MS = 1000
local activityWritten, activityCount = {}, 0
local function noteActivity(Q, sid, always, client)
  local key = Q.sactive .. '\0' .. sid
  local last = activityWritten[key]
  if not always and last and last <= Q.now
      and Q.now - last < math.min(ACTIVITY_MS, Q.lockMs / 4) then
    return
  end
  if client then
    redis.call('HSET', Q.sactive, sid, Q.now, clientField(sid), client)
  else
    redis.call('HSET', Q.sactive, sid, Q.now)
  end
  if not last then
    if activityCount >= 4096 then activityWritten, activityCount = {}, 0 end
    activityCount = activityCount + 1
  end
  activityWritten[key] = Q.now
end
