--- @include "sessionRange"
-- The index members (includes/seqMember.lua) of session `sid`'s messages on entity E, in
-- sequence order. On the queue, from its three indexes: available in sready, in flight in
-- sinflight, deferred and scheduled in sall (includes/fileMessage.lua; a message written by a
-- store before this layout is in sall too, and listed once); in the dead-letter sub-queue,
-- sall alone. From member `from` on (nil: the first), at most `limit` (nil: all).
local function sessionMembers(E, sid, from, limit)
  local lo, hi = sessionRange(sid)
  if from then lo = '[' .. from end
  local seen, out = {}, {}
  local range = { lo, hi }
  if limit then range = { lo, hi, 'LIMIT', 0, limit } end
  -- (ipairs stops at the first index E lacks: a dead-letter sub-queue has sall alone)
  for _, index in ipairs({ E.sall, E.sready, E.sinflight }) do
    for _, member in ipairs(redis.call('ZRANGEBYLEX', index, unpack(range))) do
      if not seen[member] then
        seen[member] = true
        out[#out + 1] = member
      end
    end
  end
  -- members compare in sequence order (fixed-width seqs after one session id)
  table.sort(out)
  if limit and #out > limit then
    for i = #out, limit + 1, -1 do out[i] = nil end
  end
  return out
end
