-- The fast path of PlainRegulatorStore.read's crawl delays (crawl_monitor/store.py), the
-- Crawl-delays the regulator caps rates with: the members of crawl_delayed and their keys
-- in one call.
--
-- KEYS: crawl_delayed, robots_exempt. ARGV: the crawl_delay key prefix.
-- Answers JSON {"d": {crawl_delayed member: its crawl_delay value, false when the key is
-- missing or not a string}, "e": robots_exempt members}: the members' keys in one MGET,
-- without a round trip in between; JSON, as the read script, because redis-py parses one
-- string much faster than thousands of replies. Once a loop, in the read's pipeline.
local members = redis.call('SMEMBERS', KEYS[1])
local delays = {}
if #members > 0 then
  local keys = {}
  for i, source in ipairs(members) do keys[i] = ARGV[1] .. source end
  -- unpack's limit is 8,000 values: MGET in slices.
  for i = 1, #keys, 4000 do
    local values = redis.call('MGET', unpack(keys, i, math.min(i + 3999, #keys)))
    for j = 1, #values do delays[members[i + j - 1]] = values[j] end
  end
end
return cjson.encode({d = delays, e = redis.call('SMEMBERS', KEYS[2])})
