--- @include "seqMember"
--- @include "writeMeta"
-- Lock a detached message under `token` until `lockedUntil`. A session message is held by
-- its session's lock, so it goes to sinflight and keeps no lock time of its own.
local function lockMessage(Q, E, seq, m, token, lockedUntil)
  m.st = 'l'
  m.tok = token
  if m.ss then
    redis.call('ZADD', E.sinflight, 0, seqMember(m.sid, seq))
  else
    m.lu = lockedUntil
    redis.call('ZADD', E.locked, lockedUntil, seq)
  end
  redis.call('HSET', E.tokens, token, seq)
  writeMeta(E, seq, m)
end
