-- Delivery rows (includes/deliveryRow.lua) as one string, for a wake-up that carries them
-- (lua/sendMessages.lua; busd/storage/redis/codec.py booked_rows reads it): per row its
-- field count (2 bytes), then per field a tag and, but for false, a 4-byte length and the
-- bytes: 'S' a string, 'N' an integer in decimal, 'F' false.
local function packRows(rows)
  local parts = {}
  for _, row in ipairs(rows) do
    parts[#parts + 1] = struct.pack('>I2', #row)
    for _, v in ipairs(row) do
      local t = type(v)
      if v == false then
        parts[#parts + 1] = 'F'
      elseif t == 'number' then
        local d = string.format('%d', v)
        parts[#parts + 1] = 'N' .. struct.pack('>I4', #d) .. d
      else
        parts[#parts + 1] = 'S' .. struct.pack('>I4', #v) .. v
      end
    end
  end
  return table.concat(parts)
end
