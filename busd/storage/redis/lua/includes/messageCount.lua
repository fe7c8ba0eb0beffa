-- How many messages entity E holds: those in E.all and those in flight under a session lock,
-- which are out of E.all (includes/lockMessage.lua). A message locked by a store written
-- before that layout is in both until it is settled, and counted twice meanwhile.
local function messageCount(E)
  local n = redis.call('ZCARD', E.all)
  if E.sinflight then n = n + redis.call('ZCARD', E.sinflight) end
  return n
end
