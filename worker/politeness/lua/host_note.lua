-- The fast path of noted (worker/politeness/hosts.py), for RedisPacer.pause (a
-- Retry-After) and RobotsGuard's Crawl-delay: moves a host's next slot, and notes its
-- Crawl-delay, atomically against every worker's grants.
--
-- KEYS: the host's hash. ARGV: pause (s), Crawl-delay (s, "" for none), how long the
-- delay is kept (s), idle_s. Answers how far away (s) the host's next slot is afterwards.
redis.replicate_commands()
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local key = KEYS[1]
local function number(raw)
  if type(raw) ~= 'string' or raw == '' then return nil end
  local value = tonumber(raw)
  if value == nil or value ~= value then return nil end
  return value
end
local raw = redis.pcall('HMGET', key, 'next', 'delay', 'delay_until', 'halt', 'override', 'exp')
if type(raw) ~= 'table' or raw.err ~= nil then
  redis.call('DEL', key)  -- not a hash (written by hand): read as absent, overwritten
  raw = {}
end
local next_at, delay, delay_until = number(raw[1]), number(raw[2]), number(raw[3])
local kept = (raw[4] ~= nil and raw[4] ~= false and raw[4] ~= '') or number(raw[5]) ~= nil
local expires = number(raw[6])
local pause = tonumber(ARGV[1])
local writes = {}
local new_delay = number(ARGV[2])
if new_delay ~= nil then
  local current = delay
  if delay_until == nil or delay_until <= now then current = nil end
  if current == nil or new_delay > current then
    if new_delay > pause then pause = new_delay end
  end
  delay_until = now + tonumber(ARGV[3])
  writes[#writes + 1] = 'delay'
  writes[#writes + 1] = string.format('%.17g', new_delay)
  writes[#writes + 1] = 'delay_until'
  writes[#writes + 1] = string.format('%.6f', delay_until)
end
local until_s = now + pause
if pause > 0 and until_s > (next_at or 0) then
  next_at = until_s
  writes[#writes + 1] = 'next'
  writes[#writes + 1] = string.format('%.6f', until_s)
end
local new_expires = nil
if not kept then
  local needed = (next_at or now) + tonumber(ARGV[4])
  if delay_until ~= nil and delay_until > needed then needed = delay_until end
  if expires == nil or needed > expires then
    new_expires = needed
    writes[#writes + 1] = 'exp'
    writes[#writes + 1] = string.format('%.6f', needed)
  end
end
if #writes > 0 then redis.call('HSET', key, unpack(writes)) end
if new_expires ~= nil then
  redis.call('PEXPIRE', key, math.ceil((new_expires - now) * 1000))
end
return tostring((next_at or now) - now)
