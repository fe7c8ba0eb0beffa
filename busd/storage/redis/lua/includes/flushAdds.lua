--- @include "makeGathered"
-- Make the additions gathered in `Q.adds` (includes/addTo.lua) and stop gathering.
local function flushAdds(Q)
  local adds = Q.adds
  if not adds then return end
  for _, key in ipairs(adds.keys) do
    local list = adds[key]
    if #list > 0 then makeGathered(Q, key, list) end
  end
  Q.adds = nil
end
