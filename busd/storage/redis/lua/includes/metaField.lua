-- The field of a message's metadata in its entity's body hash, beside its body (field
-- '<seq>'): storing, taking and deleting a message is one command each, not two.
-- string.format: Lua's own number-to-string conversion rounds numbers past 14 digits.
local function metaField(seq)
  return string.format('m%d', seq)
end
