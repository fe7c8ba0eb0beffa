-- ZRANGEBYLEX bounds covering every member of one session in a lexicographic index.
local function sessionRange(sid)
  return '[' .. sid .. '\0', '(' .. sid .. '\1'
end
