-- The fast path of paused_next (worker/politeness/pacing.py), for RedisPacer.pause: a
-- Retry-After moves the source's next slot, atomically against every worker's grants.
--
-- KEYS: pace_next. ARGV: delay (s). Moves the next slot to at least now + delay; answers
-- how far away (s) the next slot is afterwards.
redis.replicate_commands()
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local until_s = now + tonumber(ARGV[1])
local stored = redis.pcall('GET', KEYS[1])
local tat = type(stored) == 'string' and tonumber(stored) or 0
if tat ~= tat then tat = 0 end
if until_s > tat then
  local ttl_ms = math.ceil((until_s - now) * 1000) + 1000
  redis.call('SET', KEYS[1], string.format('%.6f', until_s), 'PX', ttl_ms)
  tat = until_s
end
return tostring(tat - now)
