--- @include "seqMember"
--- @include "fileMessage"
--- @include "countEvent"
-- Store a new message under `seq` straight into the dead-letter sub-queue, with a reason and a
-- description: a copy a subscription cannot take (no session id on a session subscription, a
-- rule that failed on it). `extra`: metadata fields to set besides (as placeMessage's).
local function placeDeadLetter(Q, seq, blob, sid, reason, description, extra)
  local d = { dc = 0 }
  if extra then
    for k, v in pairs(extra) do d[k] = v end
  end
  d.enq, d.sid, d.st, d.dlr, d.dld = Q.now, sid, 'a', reason, description
  redis.call('ZADD', Q.d.all, seq, seq)
  if sid then redis.call('ZADD', Q.d.sall, 0, seqMember(sid, seq)) end
  fileMessage(Q, Q.d, seq, d, blob)
  countEvent(Q, Q.q, 'deadlettered')
end
