-- A held session got available messages: wake its lock holder `holder` (once per script call;
-- not the holder this script runs for, `Q.caller`, which looks again by itself).
local function wakeHolder(Q, holder)
  if holder ~= Q.caller and not Q.woken[holder] then
    Q.woken[holder] = true
    redis.call(Q.publish, Q.channel .. string.match(holder, '^[^:]*'), holder)
  end
end
