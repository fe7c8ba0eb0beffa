--- @include "readMeta"
--- @include "unindexMessage"
--- @include "fileMessage"
--- @include "expireIfDue"
-- Scheduled messages that came due (at most `limit`) join the queue: enqueued at their due
-- time, their time to live counted from then, in sequence order (within their session too).
-- Returns how many index entries it met (`limit`: there may be more).
local function activateScheduled(Q, limit)
  local seqs = redis.call('ZRANGEBYSCORE', Q.q.sched, '-inf', Q.now, 'LIMIT', 0, limit)
  for _, s in ipairs(seqs) do
    local seq = tonumber(s)
    local m = readMeta(Q.q, seq)
    if m and m.st == 's' then
      unindexMessage(Q, Q.q, seq, m)
      m.st = 'a'
      m.enq = m.sch
      m.sch = nil
      if m.ttl then m.exp = m.enq + m.ttl end
      m.ttl = nil
      fileMessage(Q, Q.q, seq, m)
      expireIfDue(Q, seq, m)
      Q.activated = Q.activated + 1
    else
      redis.call('ZREM', Q.q.sched, s)
    end
  end
  return #seqs
end
