-- The fast path of PlainRegulatorStore.read (crawl_monitor/store.py) for one chunk of
-- sources and the halted sets: every source's state in one call (what
-- decision.plan_read asks for). It judges nothing: the breakers
-- (crawl_monitor/policy/breakers.py) judge what it returns. Which histograms it returns
-- follows that read's rule, which Python states in the breakers' terms, and
-- test/crawl_monitor/test_lua_twins.py holds both to the same answers.
--
-- KEYS: halted, temp_halted.
-- ARGV: JSON list of sources, window start (Unix s), then the key prefixes of the 60 s
-- window, the last-N list, both override keys, N, the JSON list of sources whose full
-- last-N histogram is wanted ("*": all; the others get one only when their last N
-- statuses all failed), the JSON list of expected statuses, the prefix of the failure
-- counters, the JSON list of each source's failure counter as last seen ("" when it
-- was missing, null when not known; the whole argument "": none known), the prefix of
-- the backoff signal counters, and the prefixes of the sets of hosts (hosts60s:,
-- error_hosts60s:).
-- A source whose counter is as last seen, and not asked in full, is not read: workers
-- bump the counter in the same atomic flush that adds a failure to the window and the
-- last-N list, so neither holds a failure the caller has not seen.
-- Answers JSON {"h": halted, "t": temp_halted, "c": [each source's failure counter, ""
-- when missing], "b": {source: backoff signal counter, of the sources that have one},
-- "s": {source: {"w": window histogram (only when it holds an error),
-- "l": last-N histogram, "n": [hosts, failing hosts] in the window (with "w" or "l"),
-- "o": override, "a": alias, "x": [errors]}}}, sources with
-- nothing to report left out. A key of the wrong type is reported in "x", not fatal.
local sources = cjson.decode(ARGV[1])
local since = ARGV[2]
local window_prefix, last_prefix = ARGV[3], ARGV[4]
local override_prefix, alias_prefix = ARGV[5], ARGV[6]
local n = tonumber(ARGV[7])
local full_all, full_for = ARGV[8] == '*', {}
if not full_all then
  for _, source in ipairs(cjson.decode(ARGV[8])) do full_for[source] = true end
end
local expected = {}
for _, status in ipairs(cjson.decode(ARGV[9])) do expected[status] = true end
local counter_prefix = ARGV[10]
local seen_counters = ARGV[11] ~= '' and cjson.decode(ARGV[11]) or nil
local backoff_prefix = ARGV[12]
local hosts_prefix, error_hosts_prefix = ARGV[13], ARGV[14]
local pcall_redis, find, sub = redis.pcall, string.find, string.sub

-- Keys of the current source that could not be read (e.g. of the wrong type).
local problems = {}
local function call(command, key, ...)
  local reply = pcall_redis(command, key, ...)
  if type(reply) == 'table' and reply.err then
    problems[#problems + 1] = key .. ': ' .. reply.err
    return nil
  end
  return reply
end

-- Status -> count, and whether any status is not an expected one.
local function histogram(items, strip_time)
  local counts, failed = {}, false
  for i = 1, #items do
    local status = items[i]
    if strip_time then
      local colon = find(status, ':', 1, true)
      if colon then status = sub(status, 1, colon - 1) end
    end
    counts[status] = (counts[status] or 0) + 1
    if not expected[status] then failed = true end
  end
  return counts, failed
end

-- A last-N histogram; most lists hold one status only, counted without a table walk.
local function list_histogram(items)
  local first = items[1]
  if first == nil then return nil end
  for i = 2, #items do
    if items[i] ~= first then return (histogram(items, false)) end
  end
  return {[first] = #items}
end

-- Whether the last n statuses are n failures: newest first, so a healthy source
-- answers at its first status.
local function all_failed(key)
  local newest = call('LINDEX', key, -1)
  if not newest or expected[newest] then return false end
  if not pcall_redis('LINDEX', key, -n) then return false end  -- fewer than n
  for i = -2, -n, -1 do
    if expected[pcall_redis('LINDEX', key, i)] then return false end
  end
  return true
end

-- The overrides, failure counters and backoff signal counters of every source in one
-- MGET (a key missing or not a string is false): one call instead of one per source.
-- 4 keys a source: READ_CHUNK keeps them under unpack's limit.
local mget_keys = {}
for i, source in ipairs(sources) do
  local k = 4 * i
  mget_keys[k - 3] = override_prefix .. source
  mget_keys[k - 2] = alias_prefix .. source
  mget_keys[k - 1] = counter_prefix .. source
  mget_keys[k] = backoff_prefix .. source
end
local values = #mget_keys > 0 and redis.call('MGET', unpack(mget_keys)) or {}

local found, counters, backoff = {}, {}, {}
for i, source in ipairs(sources) do
  local entry = nil
  local k = 4 * i
  local counter = values[k - 1] or ''
  counters[i] = counter
  if values[k] then backoff[source] = values[k] end
  local full = full_all or full_for[source]
  -- No failure since the caller last looked (and not asked in full): nothing a breaker
  -- acts on can have changed, so neither key is read. Busy, healthy sources end here.
  if full or seen_counters == nil or seen_counters[i] ~= counter then
    -- A window of expected statuses only, and at least one, means the newest statuses
    -- are not 50 failures: the permanent breaker's check is skipped (below).
    local healthy = false
    local window = call('ZRANGEBYSCORE', window_prefix .. source, since, '+inf')
    if window and #window > 0 then
      -- Most windows are all "200:{time}": one 4-byte compare a member (interned, so no
      -- new string). A window without an error can neither trip nor keep a temporary
      -- halt: it is left out, and with it most busy sources' whole entry.
      healthy = true
      for j = 1, #window do
        if sub(window[j], 1, 4) ~= '200:' then healthy = false break end
      end
      if not healthy then
        local counts, failed = histogram(window, true)
        if failed then entry = {w = counts} else healthy = true end
      end
    end
    local last_key = last_prefix .. source
    if full or (not healthy and all_failed(last_key)) then
      local last = call('LRANGE', last_key, -n, -1)
      if last then
        local counts = list_histogram(last)
        if counts then
          entry = entry or {}
          entry.l = counts
        end
      end
    end
    -- What a breaker would act on: how many hosts answered and failed in the window.
    if entry then
      entry.n = {
        call('ZCOUNT', hosts_prefix .. source, since, '+inf') or 0,
        call('ZCOUNT', error_hosts_prefix .. source, since, '+inf') or 0,
      }
    end
  end
  local override, alias = values[k - 3], values[k - 2]
  if override or alias or #problems > 0 then
    entry = entry or {}
    if override then entry.o = override end
    if alias then entry.a = alias end
    if #problems > 0 then
      entry.x = problems
      problems = {}
    end
  end
  if entry then found[source] = entry end
end
return cjson.encode({
  h = redis.call('SMEMBERS', KEYS[1]),
  t = redis.call('SMEMBERS', KEYS[2]),
  c = counters,
  b = backoff,
  s = found,
})
