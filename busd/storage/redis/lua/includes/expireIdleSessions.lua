--- @include "clientField"
--- @include "sessionHasMessages"
--- @include "countEvent"
-- Remove the sessions idle (no messages, no holder) for longer than `ttlMs`, state and
-- bookkeeping, at most `limit` of them: the oldest entries of `sidle` only, so the work does
-- not grow with the number of sessions. An entry whose session has messages or a holder again
-- is stale: dropped, and the session noted idle afresh when it next loses them
-- (includes/noteIdleSession.lua).
local function expireIdleSessions(Q, ttlMs, limit)
  local sids = redis.call('ZRANGEBYSCORE', Q.sidle, '-inf', Q.now - ttlMs, 'LIMIT', 0, limit)
  local n = 0
  for _, sid in ipairs(sids) do
    redis.call('ZREM', Q.sidle, sid)
    if redis.call('HEXISTS', Q.sholder, sid) == 0 and not sessionHasMessages(Q, sid) then
      redis.call('HDEL', Q.sstate, sid)
      redis.call('HDEL', Q.sactive, sid, clientField(sid))
      redis.call('ZREM', Q.supdated, sid)
      redis.call('ZREM', Q.sessions, sid)
      n = n + 1
    end
  end
  countEvent(Q, Q.q, 'sessionexpired', n)
  return n
end
