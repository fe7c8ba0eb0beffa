--- @include "metaField"
-- A message stored before metadata moved beside the body (docs/design.md §3.4) has it in
-- E.meta. Read (`drop` false): its metadata from there, or nil, remembered for this call when
-- found. Drop (`drop` true): the message's metadata was written to its new place or the
-- message deleted: its entry in E.meta, if this call read one, goes.
local legacyRead = {}
local function legacyMeta(E, seq, drop)
  local key = E.meta .. '\0' .. metaField(seq)
  if not drop then
    local raw = redis.call('HGET', E.meta, seq)
    if raw then legacyRead[key] = true end
    return raw
  end
  if legacyRead[key] then
    legacyRead[key] = nil
    redis.call('HDEL', E.meta, seq)
  end
end
