--- @include "metaField"
-- A message stored before metadata moved beside the body (docs/design.md §3.4) has it in
-- E.meta. Read (`drop` false): its metadata from there, or nil, remembered for this call when
-- found. Drop (`drop` true): the message's metadata was written to its new place or the
-- message deleted: its entry in E.meta, if this call read one, goes.
local legacyRead = {}
local function legacyMeta(E, seq, drop)
  if not drop then
    local raw = redis.call('HGET', E.meta, seq)
    if raw then legacyRead[E.meta .. '\0' .. metaField(seq)] = true end
    return raw
  end
  if next(legacyRead) == nil then return end -- the usual case: nothing read from there
  local key = E.meta .. '\0' .. metaField(seq)
  if legacyRead[key] then
    legacyRead[key] = nil
    redis.call('HDEL', E.meta, seq)
  end
end
