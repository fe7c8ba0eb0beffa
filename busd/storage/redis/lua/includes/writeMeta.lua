--- @include "metaField"
--- @include "legacyMeta"
-- Save a message's metadata (includes/readMeta.lua), with its body `blob` when given (a new
-- message: both in one command). Metadata read from where a store written before kept it
-- moves here.
local function writeMeta(E, seq, m, blob)
  if blob then
    redis.call('HSET', E.body, metaField(seq), cmsgpack.pack(m), seq, blob)
  else
    redis.call('HSET', E.body, metaField(seq), cmsgpack.pack(m))
  end
  legacyMeta(E, seq, true)
end
