--- @include "wakeWaiters"
-- Make what a call gathered for `key` with one command: `list.cmd` with the list's arguments
-- (after `list.flag` when set), removals (includes/removeFrom.lua) or additions
-- (includes/addTo.lua); empty the list, and wake one waiter of `list.wake`, when set, per
-- member the command added.
local function makeGathered(Q, key, list)
  local added
  if list.flag then
    added = redis.call(list.cmd, key, list.flag, unpack(list))
  else
    added = redis.call(list.cmd, key, unpack(list))
  end
  for i = #list, 1, -1 do list[i] = nil end
  if list.wake then wakeWaiters(Q, list.wake, added) end
end
