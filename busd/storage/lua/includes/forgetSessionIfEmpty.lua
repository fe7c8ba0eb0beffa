--- @include "sessionRange"
-- A session exists while it has messages or state.
local function forgetSessionIfEmpty(Q, sid)
  local lo, hi = sessionRange(sid)
  if redis.call('ZLEXCOUNT', Q.q.sall, lo, hi) == 0
      and redis.call('HEXISTS', Q.sstate, sid) == 0 then
    redis.call('ZREM', Q.sessions, sid)
    redis.call('ZREM', Q.supdated, sid)
  end
end
