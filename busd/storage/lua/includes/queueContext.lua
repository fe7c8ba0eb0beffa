--- @include "nowMs"
--- @include "queueKeys"
-- The number of a queue context's parameters below: a script's own arguments start at
-- ARGV[QUEUE_ARGC + 1] (`ARGV[c+1]` in the headers), and a script holding several contexts
-- steps by it. busd/storage/scripts.py reads it from this line for the Python side.
local QUEUE_ARGC = 7
-- The number of a queue context's keys below (busd/storage/keys.py QUEUE_KEYS): keys a script
-- takes after a queue context start at KEYS[kb + QUEUE_KEYC + 1]. The loader checks it
-- against QUEUE_KEYS.
local QUEUE_KEYC = 39
-- One queue's context: its keys (KEYS[kb+1 .. kb+QUEUE_KEYC], the order of
-- busd/storage/keys.py QUEUE_KEYS, expanded by the loader wherever a header says `Context: queue`) and the
-- parameters every state-moving script takes first (ARGV[ab+1 .. ab+QUEUE_ARGC]). The offsets
-- let one script hold several queue contexts side by side; a script with one passes 0, 0.
--   ARGV[ab+1]  queue name
--   ARGV[ab+2]  wake-up channel prefix: a process's channel is this + its process id
--   ARGV[ab+3]  lock duration ms
--   ARGV[ab+4]  max delivery count
--   ARGV[ab+5]  policy flags, a sum: 1 dead-letter expired messages (else drop them), 2 a
--               session message reaching MaxDeliveryCount dead-letters its whole session
--               (includes/deadLetterSession.lua)
--   ARGV[ab+6]  housekeeping budget (items per kind of lazy work)
--   ARGV[ab+7]  redelivery backoff (docs/design.md §2.17), '' off: '<minimum ms>,<maximum ms>,
--               <factor>'; Q.bo holds it ({ min, max, factor }, false when off)
-- `woken` makes a script wake each waiter or holder at most once; the counters feed sweep's
-- result. The keys' names (Q.sholder, Q.q.body, ...) come from includes/queueKeys.lua, kept
-- between calls, through the context's metatable.
local function queueContext(kb, ab)
  local keys = queueKeys(kb, QUEUE_KEYC) or queueKeys(kb, QUEUE_KEYC, {
    seq = KEYS[kb + 1], dedup = KEYS[kb + 2], sfree = KEYS[kb + 3], sholder = KEYS[kb + 4],
    slocks = KEYS[kb + 5], sstate = KEYS[kb + 6], supdated = KEYS[kb + 7],
    sessions = KEYS[kb + 8], swaiters = KEYS[kb + 9], procs = KEYS[kb + 10],
    q = { dlq = false, body = KEYS[kb + 11], meta = KEYS[kb + 12], all = KEYS[kb + 13],
          ready = KEYS[kb + 14], locked = KEYS[kb + 15], tokens = KEYS[kb + 16],
          deferred = KEYS[kb + 17], sall = KEYS[kb + 18], sched = KEYS[kb + 19],
          ttl = KEYS[kb + 20], sready = KEYS[kb + 21], sinflight = KEYS[kb + 22],
          waiters = KEYS[kb + 23], backoff = KEYS[kb + 39] },
    d = { dlq = true, body = KEYS[kb + 24], meta = KEYS[kb + 25], all = KEYS[kb + 26],
          ready = KEYS[kb + 27], locked = KEYS[kb + 28], tokens = KEYS[kb + 29],
          deferred = KEYS[kb + 30], sall = KEYS[kb + 31], waiters = KEYS[kb + 32] },
    stats = KEYS[kb + 33], fwd = KEYS[kb + 34], sidle = KEYS[kb + 35], sactive = KEYS[kb + 36],
    sclient = KEYS[kb + 37], quiet = KEYS[kb + 38],
  })
  local Q = {
    queue = ARGV[ab + 1], channel = ARGV[ab + 2], lockMs = tonumber(ARGV[ab + 3]),
    maxDc = tonumber(ARGV[ab + 4]), dlOnExp = tonumber(ARGV[ab + 5]) % 2 == 1,
    dlSession = tonumber(ARGV[ab + 5]) >= 2,
    budget = tonumber(ARGV[ab + 6]), bo = false,
    now = nowMs(), woken = {}, caller = false,
    expiredLocks = 0, expiredMessages = 0, activated = 0,
  }
  local bo = ARGV[ab + 7]
  if bo ~= '' then
    local lo, hi, factor = string.match(bo, '^(%d+),(%d+),([^,]+)$')
    Q.bo = { min = tonumber(lo), max = tonumber(hi), factor = tonumber(factor) }
  end
  return setmetatable(Q, keys)
end
