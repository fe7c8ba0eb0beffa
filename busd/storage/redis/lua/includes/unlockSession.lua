--- @include "sessionRange"
--- @include "memberSeq"
--- @include "readMeta"
--- @include "returnMessage"
--- @include "refreshFreeSession"
--- @include "noteIdleSession"
--- @include "forgetSessionIfEmpty"
--- @include "sessionHasMessages"
-- End a session's lock. Its delivered, unsettled messages are available again: with a
-- counted failed attempt when the lock expired (`failed`), without when the receiver closed.
-- The holder goes first, so that the session, once it has available messages, is free and
-- wakes one waiting next-available receiver (not the holder that is leaving). The end of a
-- lock is the session's last activity; left without messages, it is idle from now, or, with
-- no state either, forgotten here: its settlements left it listed while it was held
-- (lua/settleMessages.lua), and this is the one place that ends that, once per lock.
-- `failed` nil: as the lock's end says, read only when there are messages to return (a
-- session released with none, the usual end, costs no read of it).
local function unlockSession(Q, sid, failed)
  if Q.held == sid then Q.held = nil end
  -- The usual end of a session whose last message was settled: no message to return or to
  -- be free with, which counting its indexes says (includes/sessionHasMessages.lua).
  local has = sessionHasMessages(Q, sid)
  if has and failed == nil then
    local lockedUntil = tonumber(redis.call('ZSCORE', Q.slocks, sid))
    failed = not lockedUntil or lockedUntil <= Q.now
  end
  redis.call('HDEL', Q.sholder, sid)
  redis.call('ZREM', Q.slocks, sid)
  -- its holder's standing offer, if it left one (`Q.unoffered`: it says it never did)
  if not Q.unoffered then redis.call('HDEL', Q.sbook, sid) end
  local lo, hi = sessionRange(sid)
  if not has then
    if not forgetSessionIfEmpty(Q, sid, { unheld = true, empty = true }) and Q.sactive then
      redis.call('HSET', Q.sactive, sid, Q.now)
    end
    return
  end
  -- Listed while it has messages (a session held when a store written before this kept
  -- only the sessions with messages or state may have been left out of it then).
  redis.call('ZADD', Q.sessions, 0, sid)
  local counted = false
  for _, member in ipairs(redis.call('ZRANGEBYLEX', Q.q.sinflight, lo, hi)) do
    local seq = memberSeq(member)
    local m = readMeta(Q.q, seq)
    if m and m.st == 'l' then
      returnMessage(Q, Q.q, seq, m, failed)
      counted = failed
    else
      redis.call('ZREM', Q.q.sinflight, member)
    end
  end
  refreshFreeSession(Q, sid, true)
  -- a counted attempt may have dead-lettered the session's last messages, and forgotten it
  if counted and not redis.call('ZSCORE', Q.sessions, sid) then return end
  if Q.sactive then redis.call('HSET', Q.sactive, sid, Q.now) end
  noteIdleSession(Q, sid, { unheld = true })
end
