-- The holder of session `sid`, false when none. With `Q.holders` (a table,
-- lua/sendMessages.lua, lua/publishMessages.lua: a call in which no holder changes) it is read
-- once per call.
local function sessionHolder(Q, sid)
  local known = Q.holders
  local holder = known and known[sid]
  if holder == nil then
    holder = redis.call('HGET', Q.sholder, sid) or false
    if known then known[sid] = holder end
  end
  return holder
end
