--- @include "nowMs"
-- The queue's keys (KEYS[1..29], the order of busd/storage/keys.py QUEUE_KEYS) and the
-- parameters every state-moving script takes first (ARGV[1..6]).
-- `woke` makes a script publish at most once; the counters feed sweep's result.
local function queueContext()
  local Q = {
    seq = KEYS[1], dedup = KEYS[2], sfree = KEYS[3], sholder = KEYS[4], slocks = KEYS[5],
    sstate = KEYS[6], supdated = KEYS[7], sessions = KEYS[8],
    q = { dlq = false, body = KEYS[9], meta = KEYS[10], all = KEYS[11], ready = KEYS[12],
          locked = KEYS[13], tokens = KEYS[14], deferred = KEYS[15], sall = KEYS[16],
          sched = KEYS[17], ttl = KEYS[18], sready = KEYS[19], sinflight = KEYS[20] },
    d = { dlq = true, body = KEYS[21], meta = KEYS[22], all = KEYS[23], ready = KEYS[24],
          locked = KEYS[25], tokens = KEYS[26], deferred = KEYS[27], sall = KEYS[28] },
    stats = KEYS[29],
    queue = ARGV[1], channel = ARGV[2], lockMs = tonumber(ARGV[3]),
    maxDc = tonumber(ARGV[4]), dlOnExp = ARGV[5] == '1', budget = tonumber(ARGV[6]),
    now = nowMs(), woke = false,
    expiredLocks = 0, expiredMessages = 0, activated = 0,
  }
  return Q
end
