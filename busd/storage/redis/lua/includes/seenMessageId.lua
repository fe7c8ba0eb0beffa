-- Duplicate detection of one message id in `dedup` (a zset of ids by when first seen): true
-- when it was seen within the window (nothing changes), else records it (when detection is
-- on and the message has an id) and returns false.
local function seenMessageId(dedup, now, window, mid)
  if window <= 0 or mid == '' then return false end
  if redis.call('ZSCORE', dedup, mid) then return true end
  redis.call('ZADD', dedup, now, mid)
  return false
end
