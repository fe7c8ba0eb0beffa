-- Add n (default 1) to a monotonic total of what happened to an entity: `<e>.<event>` in the
-- queue's stats hash, e 'q' for the queue and 'd' for its dead-letter sub-queue. Counted here,
-- inside the transition, the totals are exact whichever process or path (links, $management,
-- admin, sweep, lazy housekeeping) made it happen.
local function countEvent(Q, E, event, n)
  n = n or 1
  if n > 0 then
    local prefix = 'q.'
    if E.dlq then prefix = 'd.' end
    redis.call('HINCRBY', Q.stats, prefix .. event, n)
  end
end
