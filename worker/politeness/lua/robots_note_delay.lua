-- The fast path of noted_crawl_delay (worker/politeness/robots.py), for
-- RobotsGuard._note_crawl_delay: keep the largest Crawl-delay of a source's hosts, and move
-- its next slot as paused_next (worker/politeness/pacing.py) does, atomically against
-- other workers' notes and grants.
--
-- KEYS: crawl_delay:{source}, crawl_delayed, pace_next:{source}. ARGV: delay (s), expiry
-- (ms), source. Keeps the largest delay of the source's hosts (a value not a number is
-- overwritten). A delay longer than the one in force also moves the source's next pacing
-- slot to at least a delay from now: the robots.txt request that brought it was a request
-- to the host.
redis.replicate_commands()
local delay = tonumber(ARGV[1])
local raw = redis.pcall('GET', KEYS[1])
local current = type(raw) == 'string' and tonumber(raw) or nil
if current == nil or current ~= current or delay >= current then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
redis.call('SADD', KEYS[2], ARGV[3])
if current == nil or current ~= current or delay > current then
  local clock = redis.call('TIME')
  local until_s = tonumber(clock[1]) + tonumber(clock[2]) / 1000000 + delay
  local stored = redis.pcall('GET', KEYS[3])
  local tat = type(stored) == 'string' and tonumber(stored) or 0
  if tat ~= tat or until_s > tat then
    redis.call('SET', KEYS[3], string.format('%.6f', until_s), 'PX', math.ceil(delay * 1000) + 1000)
  end
end
return 1
