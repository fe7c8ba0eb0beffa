--- @include "deleteMessage"
--- @include "fileMessage"
--- @include "countEvent"
-- Move a message of the queue to its dead-letter sub-queue, keeping its sequence number,
-- body, delivery count, enqueued time, properties patch and what forwarding recorded (fs,
-- hop). No TTL applies there.
local function deadLetter(Q, seq, m, reason, description)
  local body = redis.call('HGET', Q.q.body, seq)
  deleteMessage(Q, Q.q, seq, m)
  local d = { dc = m.dc, enq = m.enq, sid = m.sid, st = 'a', dlr = reason, dld = description,
              pp = m.pp, fs = m.fs, hop = m.hop }
  redis.call('ZADD', Q.d.all, seq, seq)
  if d.sid then redis.call('ZADD', Q.d.sall, 0, seqMember(d.sid, seq)) end
  fileMessage(Q, Q.d, seq, d, body)
  countEvent(Q, Q.q, 'deadlettered')
end
