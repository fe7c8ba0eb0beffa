-- The staged-transaction keys of a `Context: transaction` script: they follow the via
-- entity's queue context, which holds `ctx` keys (the caller passes its size).
local function transactionKeys(ctx)
  return { txns = KEYS[ctx + 1], txops = KEYS[ctx + 2] }
end
