-- Forget transaction `txn`'s staged operations (`txns`, `txops`: lua/stageTransaction-2.lua).
-- Returns how many there were.
local function dropStaged(txns, txops, txn)
  local n = tonumber(redis.call('HGET', txops, txn .. ':n') or '0')
  local fields = { txn .. ':n' }
  for i = 1, n do
    fields[#fields + 1] = txn .. ':' .. i
    if #fields >= 200 then
      redis.call('HDEL', txops, unpack(fields))
      fields = {}
    end
  end
  if #fields > 0 then redis.call('HDEL', txops, unpack(fields)) end
  redis.call('ZREM', txns, txn)
  return n
end
