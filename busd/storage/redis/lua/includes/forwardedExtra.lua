-- The metadata a message forwarded on a Redis Cluster brings to its destination
-- (includes/readMeta.lua): from the seven arguments at ARGV[i ..] of forwardEnqueue and
-- forwardPublish: first sequence number, hop count, dead-letter source, reason and
-- description, properties patch ('' where absent), time to live ms ('' none).
local function forwardedExtra(i)
  local function opt(v)
    if v == '' then return nil end
    return v
  end
  return { fs = tonumber(ARGV[i]), hop = tonumber(ARGV[i + 1]), dls = opt(ARGV[i + 2]),
           dlr = opt(ARGV[i + 3]), dld = opt(ARGV[i + 4]), pp = opt(ARGV[i + 5]) },
         tonumber(ARGV[i + 6])
end
