--- @include "wakeWaiters"
-- Make the additions gathered for `key` (includes/addTo.lua) with one command, empty its
-- list, and wake one waiter of the list's `wake` per member the command added.
local function makeAdds(Q, key, list)
  local added
  if list.flag then
    added = redis.call(list.cmd, key, list.flag, unpack(list))
  else
    added = redis.call(list.cmd, key, unpack(list))
  end
  for i = #list, 1, -1 do list[i] = nil end
  if list.wake then wakeWaiters(Q, list.wake, added) end
end
