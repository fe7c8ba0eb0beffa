-- The catalog hash (busd.storage.keys.catalog_key, outside every hash tag) of a script that
-- checks an entity record: the caller passes it after a context of `ctx` keys (the source's,
-- in lua/forwardMessages.lua).
local function catalogKey(ctx)
  return KEYS[ctx + 1]
end
