--- @include "readMeta"
--- @include "unindexMessage"
--- @include "fileMessage"
-- Messages whose redelivery backoff ended by `upTo` (ms, or '+inf': all, when the queue's
-- backoff was turned off) become available as any returned message does: a plain one joins
-- `ready` and wakes a waiting receiver; one of a session wakes its holder, or makes its
-- session free again (docs/design.md §2.17). At most `limit`; returns how many index
-- entries it met (`limit`: there may be more).
local function activateBackoff(Q, limit, upTo)
  local seqs = redis.call('ZRANGEBYSCORE', Q.q.backoff, '-inf', upTo, 'LIMIT', 0, limit)
  for _, s in ipairs(seqs) do
    local seq = tonumber(s)
    local m = readMeta(Q.q, seq)
    if m and m.st == 'a' and m.due then
      unindexMessage(Q, Q.q, seq, m)
      m.st = 'a'
      fileMessage(Q, Q.q, seq, m)
    else
      redis.call('ZREM', Q.q.backoff, s)
    end
  end
  return #seqs
end
