-- The fast path of `image-crawler status`'s read (crawlctl/status/model.py): every
-- source's keys in one call, timed by Redis' clock.
--
-- KEYS: the per-status error counters (resize_errors:{source}:{status}) the caller found
-- in their index, or with SCAN (image_crawler/error_reasons.py): a SCAN here would hold
-- Redis for the whole walk of its keyspace.
-- ARGV: the set and hash names, then key prefixes and counters, in the order of _ARGV.
-- Answers JSON {"sources": {name: {...}}, "halted": [...], "temp_halted": [...],
-- "robots_exempt": [...], "reasons": [the count of each of KEYS, in order, or false],
-- "rechecks": [field, count, ...] (HGETALL of the hash rechecks), "backlog_at": ...,
-- "totals": {...}, "now": [seconds, microseconds], "paused": crawl_paused or false,
-- "dns": [worker, report, ...] (HGETALL of the hash dns_workers), "placements": [field,
-- count, ...] (HGETALL of the hash dedup_placements)}. A key of the wrong
-- type reads as absent rather than failing the view. "now" is Redis's clock, not the operator's: the
-- workers write pace_next from Redis's TIME, so only that clock compares with it.
local inbound, halted_set, temp_set, rates_hash = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local pace_rate_prefix, resized, errors, last_prefix = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local override_prefix, alias_prefix, split, malformed = ARGV[9], ARGV[10], ARGV[11], ARGV[12]
local pace_next_prefix, exempt_set, crawl_delay_prefix = ARGV[13], ARGV[14], ARGV[15]
local disallowed_status, backlog_hash, backlog_at = ARGV[16], ARGV[17], ARGV[18]
local lost_prefix, no_index_status, rechecks_hash = ARGV[19], ARGV[20], ARGV[21]
local paused_key, dns_hash, placements_hash = ARGV[22], ARGV[23], ARGV[24]

local function call(...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err then return false end
  return reply
end

local names, seen = {}, {}
local function add(list)
  if not list then return end
  for i = 1, #list do
    if not seen[list[i]] then seen[list[i]] = true; names[#names + 1] = list[i] end
  end
end
local halted = call('SMEMBERS', halted_set) or {}
local temp = call('SMEMBERS', temp_set) or {}
local exempt = call('SMEMBERS', exempt_set) or {}
add(call('SMEMBERS', inbound))
add(halted)
add(temp)
add(exempt)
local rates = {}
local flat = call('HGETALL', rates_hash) or {}
for i = 1, #flat, 2 do
  rates[flat[i]] = flat[i + 1]
  add({flat[i]})
end
-- A topic with URLs waiting shows even when its source is in no set (Redis lost them).
local backlog = {}
flat = call('HGETALL', backlog_hash) or {}
for i = 1, #flat, 2 do
  backlog[flat[i]] = flat[i + 1]
  add({flat[i]})
end

local sources = {}
for _, s in ipairs(names) do
  sources[s] = {
    rate = rates[s] or false,
    pace_rate = call('GET', pace_rate_prefix .. s),
    pace_next = call('GET', pace_next_prefix .. s),
    ok = call('GET', resized .. ':' .. s),
    errors = call('GET', errors .. ':' .. s),
    last = call('LRANGE', last_prefix .. s, 0, -1) or {},
    override = call('GET', override_prefix .. s),
    alias = call('GET', alias_prefix .. s),
    disallowed = call('GET', errors .. ':' .. s .. ':' .. disallowed_status),
    no_index = call('GET', errors .. ':' .. s .. ':' .. no_index_status),
    crawl_delay = call('GET', crawl_delay_prefix .. s),
    backlog = backlog[s] or false,
    lost = call('GET', lost_prefix .. ':' .. s),
  }
end
-- MGET in slices: one call a key costs more than the read, and unpack has a stack limit.
local reasons = {}
for first = 1, #KEYS, 1000 do
  local last = math.min(first + 999, #KEYS)
  local counts = redis.call('MGET', unpack(KEYS, first, last))
  for i = first, last do
    reasons[i] = counts[i - first + 1]
  end
end
return cjson.encode({
  sources = sources, halted = halted, temp_halted = temp, robots_exempt = exempt,
  reasons = reasons, rechecks = call('HGETALL', rechecks_hash) or {},
  backlog_at = call('GET', backlog_at), now = redis.call('TIME'),
  paused = call('GET', paused_key),
  dns = call('HGETALL', dns_hash) or {},
  placements = call('HGETALL', placements_hash) or {},
  totals = {
    num_resized = call('GET', resized), resize_errors = call('GET', errors),
    num_split = call('GET', split), num_malformed = call('GET', malformed),
  },
})
