-- The fast path of pacing_interval_s and gcra_grant (worker/politeness/pacing.py), the
-- pacing rule (a generic cell rate algorithm): grants each asking source's slots within
-- the horizon, for every asking source in one call.
--
-- ARGV: rate prefix, next prefix, horizon (s), JSON [[source, wanted], ...], crawl-delay
-- prefix (a source's crawl_delay, when set, is the shortest interval). Answers JSON,
-- one entry per ask: false when the source has no rate (absent, not a number, <= 0), else
-- [seconds until its next slot comes within the horizon, [offset of each granted slot
-- from now, in seconds], the interval 1/rate] (an empty list may come back as {}). Both
-- keys may be of the wrong type (written by hand): read as absent; pace_next is
-- overwritten.
redis.replicate_commands()
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local rate_prefix, next_prefix = ARGV[1], ARGV[2]
local horizon = tonumber(ARGV[3])
local answers = {}
for i, ask in ipairs(cjson.decode(ARGV[4])) do
  local source, wanted = ask[1], ask[2]
  local raw = redis.pcall('GET', rate_prefix .. source)
  local rate = type(raw) == 'string' and tonumber(raw) or nil
  if rate == nil or rate ~= rate or rate <= 0 or rate == math.huge then
    answers[i] = false
  else
    local key = next_prefix .. source
    local stored = redis.pcall('GET', key)
    local tat = type(stored) == 'string' and tonumber(stored) or now
    if tat ~= tat or tat < now then tat = now end
    local interval = 1 / rate
    local delay = redis.pcall('GET', ARGV[5] .. source)
    delay = type(delay) == 'string' and tonumber(delay) or nil
    if delay ~= nil and delay == delay and delay > interval and delay ~= math.huge then
      interval = delay
    end
    local slots = {}
    while #slots < wanted and tat <= now + horizon do
      slots[#slots + 1] = tat - now
      tat = tat + interval
    end
    if #slots > 0 then
      local ttl_ms = math.ceil((tat - now) * 1000) + 1000
      redis.call('SET', key, string.format('%.6f', tat), 'PX', ttl_ms)
    end
    answers[i] = {tat - horizon - now, slots, interval}
  end
end
return cjson.encode(answers)
