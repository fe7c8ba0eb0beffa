--- @include "makeGathered"
-- Removals gathered per key while a call deletes messages one after another (`Q.batch`, set by
-- lua/settleMessages.lua while it applies two or more completions): the members or fields a
-- deletion takes out of a key (`a`, and `b` when given) are taken out of it by one command per
-- key when the call flushes (includes/flushRemovals.lua), not one per message: a settle of n
-- completions makes n reads, then one ZREM of the session index and one HDEL of the bodies
-- (docs/design.md §3.19). Without `Q.batch`, at once. A key is removed from by one command
-- only (a zset's ZREM or a hash's HDEL), so the key names its list. A key's gathered
-- removals are made once they are REMOVE_MAX arguments, one command's worth.
local REMOVE_MAX = 500
local function removeFrom(Q, cmd, key, a, b)
  local batch = Q.batch
  if not batch then
    if b then return redis.call(cmd, key, a, b) end
    return redis.call(cmd, key, a)
  end
  local list = batch[key]
  if not list then
    list = { cmd = cmd }
    batch[key] = list
    batch.keys[#batch.keys + 1] = key
  end
  list[#list + 1] = a
  if b then list[#list + 1] = b end
  if #list >= REMOVE_MAX then makeGathered(Q, key, list) end
end
