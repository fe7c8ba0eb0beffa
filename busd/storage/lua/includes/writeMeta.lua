local function writeMeta(E, seq, m)
  redis.call('HSET', E.meta, seq, cmsgpack.pack(m))
end
