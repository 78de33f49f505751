-- Gantry rate limit: admit one request only if every window has room, atomically.
-- KEYS[i]: per-window hash {s = window start (unix secs), n = count}; all share one hash tag.
-- ARGV[2i-1], ARGV[2i]: quota and length (secs) of window i.
-- Returns {unix secs, micros, count before this request for each window}.
local now = redis.call('TIME')
local secs = tonumber(now[1])
local starts, counts = {}, {}
local admit = true
for i = 1, #KEYS do
  local quota = tonumber(ARGV[2 * i - 1])
  local len = tonumber(ARGV[2 * i])
  local start = secs - (secs % len)
  local stored = redis.call('HMGET', KEYS[i], 's', 'n')
  local count = 0
  if tonumber(stored[1]) == start then
    count = tonumber(stored[2]) or 0
  end
  starts[i] = start
  counts[i] = count
  if count >= quota then
    admit = false
  end
end
if admit then
  for i = 1, #KEYS do
    redis.call('HSET', KEYS[i], 's', starts[i], 'n', counts[i] + 1)
    if counts[i] == 0 then
      -- First hit of a new window: the key dies when the window ends.
      redis.call('EXPIREAT', KEYS[i], starts[i] + tonumber(ARGV[2 * i]))
    end
  end
end
local reply = {secs, tonumber(now[2])}
for i = 1, #KEYS do
  reply[#reply + 1] = counts[i]
end
return reply
