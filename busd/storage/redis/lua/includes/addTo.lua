--- @include "makeGathered"
-- Additions gathered per key while a send files its messages one after another (`Q.adds`, set
-- by lua/sendMessages.lua, and per subscription by lua/publishMessages.lua, for a call of two
-- or more messages): what each message adds to an index (ZADD) or writes beside its body
-- (HSET) is made by one command per key when the call flushes (includes/flushAdds.lua), not
-- one per message, so a send of n messages to n sessions costs each index one ZADD
-- (docs/design.md §3.19). Without `Q.adds`, at once. Sound only while the call reads none of
-- what it gathered: those two gather only where they read none.
-- `wake`: the waiters a ZADD wakes, one per member it adds (includes/wakeWaiters.lua), as a
-- ZADD of one member wakes one when it adds it; `flag`, a ZADD flag (LT) for the whole key.
-- A key is added to by one kind of command with one flag, so the key names its list. A key's
-- gathered additions are made once they are ADD_MAX arguments, one command's worth.
local ADD_MAX = 1000

local function addTo(Q, cmd, key, a, b, c, d, flag, wake)
  local adds = Q.adds
  if not adds then
    local added
    if flag then
      added = redis.call(cmd, key, flag, a, b)
    elseif c then
      added = redis.call(cmd, key, a, b, c, d)
    else
      added = redis.call(cmd, key, a, b)
    end
    if wake and added == 1 then wakeWaiters(Q, wake, 1) end
    return
  end
  local list = adds[key]
  if not list then
    list = { cmd = cmd, flag = flag, wake = wake }
    adds[key] = list
    adds.keys[#adds.keys + 1] = key
  end
  list[#list + 1] = a
  list[#list + 1] = b
  if c then
    list[#list + 1] = c
    list[#list + 1] = d
  end
  if #list >= ADD_MAX then makeGathered(Q, key, list) end
end
