--- @include "makeGathered"
-- Make the removals gathered in `Q.batch` (includes/removeFrom.lua), then gather anew
-- (`again`) or stop gathering.
local function flushRemovals(Q, again)
  local batch = Q.batch
  if batch then
    for _, key in ipairs(batch.keys) do
      local list = batch[key]
      if list and #list > 0 then makeGathered(Q, key, list) end
    end
  end
  Q.batch = again and { keys = {} } or nil
end
