-- Removals gathered per key while a call deletes messages one after another (`Q.batch`, set by
-- lua/settleMessages.lua while it applies completions): the members or fields a deletion
-- takes out of a key are taken out of it by one command per key when the call flushes
-- (includes/flushRemovals.lua), not one per message: a settle of n completions makes n reads,
-- then one ZREM of the session index and one HDEL of the bodies (docs/design.md §3.19).
-- Without `Q.batch`, at once. A key's gathered removals are made once they are REMOVE_MAX
-- arguments, one command's worth.
local REMOVE_MAX = 500
local function removeFrom(Q, cmd, key, ...)
  local b = Q.batch
  if not b then return redis.call(cmd, key, ...) end
  local id = cmd .. '\0' .. key
  local list = b[id]
  if not list then
    list = {}
    b[id] = list
    b.order[#b.order + 1] = { cmd, key, list }
  end
  for _, v in ipairs({ ... }) do list[#list + 1] = v end
  if #list >= REMOVE_MAX then
    redis.call(cmd, key, unpack(list))
    for i = #list, 1, -1 do list[i] = nil end
  end
end
