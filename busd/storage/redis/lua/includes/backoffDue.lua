-- When a message that has just failed its `dc`-th delivery is due again under the queue's
-- redelivery backoff (docs/design.md §2.17): now + minimum * factor^(dc-1), at most the
-- maximum; false when the queue has no backoff. (A power past a double's range is inf, which
-- the maximum bounds.)
local function backoffDue(Q, dc)
  local bo = Q.bo
  if not bo then return false end
  return Q.now + math.floor(math.min(bo.min * bo.factor ^ math.max(dc - 1, 0), bo.max))
end
