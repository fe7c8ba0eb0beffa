-- A held session got available messages: wake its lock holder (once per script call; not the
-- holder this script runs for, `Q.caller`, which looks again by itself).
local function wakeHolder(Q, sid)
  local holder = redis.call('HGET', Q.sholder, sid)
  if holder and holder ~= Q.caller and not Q.woken[holder] then
    Q.woken[holder] = true
    redis.call('PUBLISH', Q.channel .. string.match(holder, '^[^:]*'), holder)
  end
end
