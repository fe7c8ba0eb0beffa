-- The staged-transaction keys of a `Context: transaction` script: the first two KEYS, or
-- those after `kb` others.
local function transactionKeys(kb)
  return { txns = KEYS[kb + 1], txops = KEYS[kb + 2] }
end
