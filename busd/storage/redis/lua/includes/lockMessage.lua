--- @include "seqMember"
--- @include "writeMeta"
--- @include "lockToken"
--- @include "addTo"
-- Lock a detached message under the broker's `token` made to name it (includes/lockToken.lua;
-- the lock's token is m.tok from then on) until `lockedUntil`. A session message is held by
-- its session's lock, so it goes to sinflight and keeps no lock time of its own; the caller
-- names the session's holder in m.h when it knows it (includes/checkSettlement.lua). `blob`: the
-- body of a new message, stored with its metadata.
-- A session message is in one of its session's indexes at a time (includes/fileMessage.lua):
-- in flight, in sinflight (its caller took it out of sready); one taken out of the deferred
-- state leaves sall here (m.xs says it is out of sall).
-- In flight under a session lock, a message is out of E.all too (m.xa says so): a message sent
-- to its session's holder and completed by it then costs E.all nothing (docs/design.md §3.4).
-- A new one (`blob`) was never put there; one taken leaves it here.
local function lockMessage(Q, E, seq, m, token, lockedUntil, blob)
  m.st = 'l'
  m.tok = lockToken(token, seq)
  if m.ss then
    local member = seqMember(m.sid, seq)
    addTo(Q, 'ZADD', E.sinflight, 0, member)
    if not (blob or m.xs) then redis.call('ZREM', E.sall, member) end
    m.xs = 1
    if not (blob or m.xa) then redis.call('ZREM', E.all, seq) end
    m.xa = 1
  else
    if m.xa then -- back in E.all: a forwarder's lock is not a session's (lua/forwardTake.lua)
      redis.call('ZADD', E.all, seq, seq)
      m.xa = nil
    end
    m.lu = lockedUntil
    redis.call('ZADD', E.locked, lockedUntil, seq)
  end
  writeMeta(E, seq, m, blob, Q)
end
