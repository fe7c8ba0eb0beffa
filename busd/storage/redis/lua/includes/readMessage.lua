--- @include "metaField"
--- @include "legacyMeta"
-- A message's metadata (includes/readMeta.lua) and body in one read: nil when the entity has
-- no such message.
local function readMessage(E, seq)
  local got = redis.call('HMGET', E.body, metaField(seq), seq)
  local raw = got[1] or legacyMeta(E, seq)
  if not raw then return nil end
  return cmsgpack.unpack(raw), got[2]
end
