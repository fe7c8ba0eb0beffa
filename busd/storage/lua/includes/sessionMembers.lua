--- @include "sessionRange"
-- The index members (includes/seqMember.lua) of session `sid`'s messages in the queue, in
-- sequence order: those in sall and those in flight, which are in sinflight instead
-- (includes/lockMessage.lua; one locked by a store written before is in both, and listed
-- once). From member `from` on (nil: the first), at most `limit` (nil: all).
local function sessionMembers(Q, sid, from, limit)
  local lo, hi = sessionRange(sid)
  if from then lo = '[' .. from end
  local a, b
  if limit then
    a = redis.call('ZRANGEBYLEX', Q.q.sall, lo, hi, 'LIMIT', 0, limit)
    b = redis.call('ZRANGEBYLEX', Q.q.sinflight, lo, hi, 'LIMIT', 0, limit)
  else
    a = redis.call('ZRANGEBYLEX', Q.q.sall, lo, hi)
    b = redis.call('ZRANGEBYLEX', Q.q.sinflight, lo, hi)
  end
  if #b == 0 then return a end
  local out, i, j = {}, 1, 1
  while (i <= #a or j <= #b) and not (limit and #out >= limit) do
    local x, y = a[i], b[j]
    if y == nil or (x ~= nil and x < y) then
      out[#out + 1] = x
      i = i + 1
    else
      out[#out + 1] = y
      j = j + 1
      if x == y then i = i + 1 end
    end
  end
  return out
end
