-- Make the removals gathered in `Q.batch` (includes/removeFrom.lua), then gather anew
-- (`again`) or stop gathering.
local function flushRemovals(Q, again)
  local b = Q.batch
  if b then
    for _, e in ipairs(b.order) do
      if #e[3] > 0 then redis.call(e[1], e[2], unpack(e[3])) end
    end
  end
  Q.batch = again and { order = {} } or nil
end
