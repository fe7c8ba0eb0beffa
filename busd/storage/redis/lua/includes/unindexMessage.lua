--- @include "seqMember"
--- @include "refreshFreeSession"
--- @include "removeFrom"
-- Take a message out of the index of its current state (the message itself stays) and mark
-- it detached ('x'); the caller files it elsewhere or deletes it. A session message its
-- forwarder held under a plain lock (fl, lua/forwardTake.lua) is a session message again.
-- Out of its lock's index in the call's batch of removals when it has one
-- (includes/removeFrom.lua).
local function unindexMessage(Q, E, seq, m)
  local st = m.st
  if st == 'a' then
    local delayed = m.due -- waiting out its redelivery backoff (includes/fileMessage.lua)
    if delayed then
      redis.call('ZREM', E.backoff, seq)
      m.due = nil
    end
    if m.ss then
      redis.call('ZREM', E.sready, seqMember(m.sid, seq))
      refreshFreeSession(Q, m.sid)
    elseif not delayed then
      redis.call('ZREM', E.ready, seq)
    end
    if m.exp and not E.dlq then redis.call('ZREM', E.ttl, seq) end
  elseif st == 'l' then
    if m.ss then
      removeFrom(Q, 'ZREM', E.sinflight, seqMember(m.sid, seq))
    else
      removeFrom(Q, 'ZREM', E.locked, seq)
    end
    -- only a lock taken before tokens named their message has an entry (lockedMessage.lua)
    if #m.tok ~= 16 or struct.unpack('>I8', m.tok) ~= seq then redis.call('HDEL', E.tokens, m.tok) end
    m.tok = nil
    m.lu = nil
    m.h = nil
  elseif st == 'd' then
    redis.call('ZREM', E.deferred, seq)
  elseif st == 's' then
    redis.call('ZREM', E.sched, seq)
  end
  m.st = 'x'
  if m.fl then m.ss, m.fl = 1, nil end
end
