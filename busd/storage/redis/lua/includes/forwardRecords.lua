-- The destination's records of messages forwarded into it on a Redis Cluster, kept in its
-- duplicate-detection set `dedup` under '\0fwd:<source>:<seq>:<enqueued ms>' (no message id
-- starts with NUL) and scored a day ahead, so that duplicate detection's window never drops
-- one while its move is under way. Forgets the k records at ARGV[first ..] (their moves are
-- done), and records left by a forwarder that died between its two steps once a day has
-- passed. Returns the index after them.
local function forwardRecords(dedup, now, window, first, k)
  for j = first, first + k - 1 do redis.call('ZREM', dedup, ARGV[j]) end
  if window > 0 then
    redis.call('ZREMRANGEBYSCORE', dedup, '-inf', now - window)
  else
    redis.call('ZREMRANGEBYSCORE', dedup, '-inf', now)
  end
  return first + k
end
