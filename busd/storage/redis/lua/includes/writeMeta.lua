--- @include "metaField"
--- @include "legacyMeta"
--- @include "addTo"
-- Save a message's metadata (includes/readMeta.lua), with its body `blob` when given (a new
-- message: both in one command). Metadata read from where a store written before kept it
-- moves here. With `Q` and blob, a new message's write is gathered with its call's others
-- (includes/addTo.lua).
local function writeMeta(E, seq, m, blob, Q)
  if blob and Q then
    addTo(Q, 'HSET', E.body, metaField(seq), cmsgpack.pack(m), seq, blob)
  elseif blob then
    redis.call('HSET', E.body, metaField(seq), cmsgpack.pack(m), seq, blob)
  else
    redis.call('HSET', E.body, metaField(seq), cmsgpack.pack(m))
  end
  legacyMeta(E, seq, true)
end
