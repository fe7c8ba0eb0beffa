--- @include "readMeta"
--- @include "returnMessage"
--- @include "countEvent"
-- Locks that ran out: each such message counts a failed delivery attempt and is available
-- again (or dead-lettered at MaxDeliveryCount). At most `limit` per call; returns how many
-- index entries it met (`limit`: there may be more).
local function expireMessageLocks(Q, E, limit)
  local seqs = redis.call('ZRANGEBYSCORE', E.locked, '-inf', Q.now, 'LIMIT', 0, limit)
  for _, s in ipairs(seqs) do
    local seq = tonumber(s)
    local m = readMeta(E, seq)
    if m and m.st == 'l' then
      countEvent(Q, E, 'lockexpired')
      returnMessage(Q, E, seq, m, true)
    else
      redis.call('ZREM', E.locked, s)
    end
  end
  Q.expiredLocks = Q.expiredLocks + #seqs
  return #seqs
end
