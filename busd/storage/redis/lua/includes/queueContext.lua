--- @include "nowMs"
--- @include "queueKeys"
-- The number of a queue context's parameters below: a script's own arguments start at
-- ARGV[QUEUE_ARGC + 1] (`ARGV[c+1]` in the headers), and a script holding several contexts
-- steps by it. busd/storage/redis/scripts.py reads it from this line for the Python side.
local QUEUE_ARGC = 7
-- The number of a queue context's keys: one, the prefix its keys share, from which
-- includes/queueKeys.lua names them all (busd/storage/keys.py QUEUE_KEYS). Keys a script takes
-- after a queue context start at KEYS[kb + QUEUE_KEYC + 1].
local QUEUE_KEYC = 1
-- One queue's context: its key (KEYS[kb+1], busd/storage/keys.py context_key, passed by the
-- loader wherever a header says `Context: queue`) and the parameters every state-moving
-- script takes first (ARGV[ab+1 .. ab+QUEUE_ARGC]). The offsets let one script hold several
-- queue contexts side by side; a script with one passes 0, 0.
--   ARGV[ab+1]  queue name
--   ARGV[ab+2]  wake-up channel prefix: a process's channel is this + its process id. On a
--               Cluster it carries the context's hash tag (`{<tag>}:wake:`), and wake-ups go
--               by sharded pub/sub (SPUBLISH: they stay on the shard, busd/storage/
--               shard_wakeups.py); else by PUBLISH
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
  local keys = queueKeys(KEYS[kb + 1])
  local Q = {
    queue = ARGV[ab + 1], channel = ARGV[ab + 2], lockMs = tonumber(ARGV[ab + 3]),
    publish = string.byte(ARGV[ab + 2], 1) == 123 and 'SPUBLISH' or 'PUBLISH', -- 123: '{'
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
