-- The fast path of PlainRegulatorStore.write (crawl_monitor/store.py): one loop's Writes
-- (crawl_monitor/policy/decision.py decides them) under the leader's lease, in one atomic
-- call.
--
-- KEYS: halted, temp_halted, crawl_rates, monitor_leader.
-- ARGV: JSON plan {"pace": {source: "rate"}, "rates": {source: PacingInfo JSON},
-- "rates_whole": bool, "rates_gone": [...], "halt": [...], "temp_halt": [...],
-- "lift": [...], "clear_window": [...], "forget_delayed": [...]}, the pace_rate TTL (ms),
-- the pace_rate prefix, the window prefix, the writer's lease token ("" when it runs
-- without a lease), the lease's TTL (ms) and the crawl_delay prefix; KEYS[5]: crawl_delayed.
-- A source in `halted` when this runs gets "0" whatever the plan says. A source of
-- "forget_delayed" leaves crawl_delayed only if its crawl_delay key is still missing: a
-- worker may have set it (and SADDed) since the read.
-- crawl_rates gets the fields of "rates" and loses those of "rates_gone"; with
-- "rates_whole" it is replaced by "rates". Answers {1, pace_rate keys set}, or {0, holder}
-- with nothing written when the lease is not the writer's (holder "" when nobody holds
-- it); the writer's lease is renewed first.
local plan = cjson.decode(ARGV[1])
local ttl, pace_prefix, window_prefix = ARGV[2], ARGV[3], ARGV[4]
local token, lease_ms = ARGV[5], ARGV[6]
if token ~= '' then
  local holder = redis.call('GET', KEYS[4])
  if holder ~= token then return {0, holder or ''} end
  redis.call('PEXPIRE', KEYS[4], lease_ms)
end
for _, source in ipairs(plan.halt) do redis.call('SADD', KEYS[1], source) end
for _, source in ipairs(plan.temp_halt) do redis.call('SADD', KEYS[2], source) end
for _, source in ipairs(plan.lift) do redis.call('SREM', KEYS[2], source) end
for _, source in ipairs(plan.clear_window) do redis.call('DEL', window_prefix .. source) end
for _, source in ipairs(plan.forget_delayed) do
  if redis.call('EXISTS', ARGV[7] .. source) == 0 then redis.call('SREM', KEYS[5], source) end
end
if plan.rates_whole then redis.call('DEL', KEYS[3]) end
-- A thousand fields a call: one HSET per source costs far more, and unpack has a limit.
local fields, count = {}, 0
for source, info in pairs(plan.rates) do
  fields[count + 1], fields[count + 2] = source, info
  count = count + 2
  if count == 2000 then
    redis.call('HSET', KEYS[3], unpack(fields, 1, count))
    count = 0
  end
end
if count > 0 then redis.call('HSET', KEYS[3], unpack(fields, 1, count)) end
local gone = plan.rates_gone
for i = 1, #gone, 1000 do
  redis.call('HDEL', KEYS[3], unpack(gone, i, math.min(i + 999, #gone)))
end
local halted = {}
for _, source in ipairs(redis.call('SMEMBERS', KEYS[1])) do halted[source] = true end
local set = 0
for source, rate in pairs(plan.pace) do
  if halted[source] then rate = '0' end
  redis.call('SET', pace_prefix .. source, rate, 'PX', ttl)
  set = set + 1
end
return {1, set}
