-- Tell waiting receivers on every broker process that the queue may have work (once per call).
local function wake(Q)
  if not Q.woke then
    redis.call('PUBLISH', Q.channel, Q.queue)
    Q.woke = true
  end
end
