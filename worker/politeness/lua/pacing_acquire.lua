-- The fast path of decide_source (worker/politeness/hosts.py), the pacing rule per host
-- within its source's rate (host_step, ceiling_rps, blocked, host_interval,
-- round_robin_grant, expiry, host_why, indexed): applies each host's report, grants the
-- slots of every asking host of every asking source, and keeps each source's host index
-- (host_index:{source}, image_crawler/contract.py), in one call.
--
-- ARGV[1]: JSON {"rp": rate prefix, "np": source next prefix, "hp": host hash prefix,
-- "cp": host_rate prefix, "h": horizon (s), "s": the rule's parameters
-- (HostSettings.to_json_obj, with the host index's key prefix "ix")}. ARGV[2]: JSON
-- [[source, [[host, wanted, [clean, signals, refused, failed, last]], ...]], ...].
-- Answers JSON {"t": Redis' TIME as "seconds.micros", "a": answers}, one answer per source:
-- false when the source has no rate (absent, not a
-- number, <= 0; its hosts are left as they are), else one entry per host: [seconds until it is worth asking again, [offset of each
-- granted slot from now (s)], the host's interval (s), flag ("", "g", "h" or "m")]. An
-- empty list may come back as {}. Keys of the wrong type read as absent; a source's
-- pace_next, and its host index, are then overwritten. The host index costs nothing on
-- most asks: per source and ask at most one ZADD (the hosts whose member is due), one
-- ZREMRANGEBYSCORE per band written and one PEXPIRE.
redis.replicate_commands()
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local config = cjson.decode(ARGV[1])
local s = config.s
local horizon = config.h

local function number(raw)
  if type(raw) ~= 'string' or raw == '' then return nil end
  local value = tonumber(raw)
  if value == nil or value ~= value then return nil end
  return value
end

local function read_host(key)
  local raw = redis.pcall('HGETALL', key)
  local f = {}
  if type(raw) == 'table' and raw.err == nil then
    for i = 1, #raw, 2 do f[raw[i]] = raw[i + 1] end
  else
    redis.call('DEL', key)  -- not a hash (written by hand): read as absent, overwritten
  end
  local halt = f.halt
  if halt == '' then halt = nil end
  return {
    next_at = number(f.next), rate = number(f.rate), slow = f.ss == '1',
    cut_at = number(f.cut), climb_at = number(f.climb), delay = number(f.delay),
    delay_until = number(f.delay_until), fails = math.floor(number(f.fails) or 0),
    since = number(f.since), ['until'] = number(f['until']),
    halts = math.floor(number(f.halts) or 0), gone = number(f.gone), halt = halt,
    override = number(f.override), expires = number(f.exp),
    last = math.floor(number(f.last) or 0), why = f.why ~= '' and f.why or nil,
    seen = number(f.seen),
  }, f
end

local function ceiling_of(source_rps, host_rate, override)
  local cap = override
  if cap == nil then cap = host_rate end
  if cap == nil or not (cap > 0) then
    cap = s.cap
    if cap < 0 then cap = nil end
  end
  if cap ~= nil and cap > 0 and cap < source_rps then return cap end
  return source_rps
end

local function step(st, report, ceiling)
  if st.rate == nil then
    st.rate = s.start < ceiling and s.start or ceiling
    st.slow = true
    st.climb_at = now
  end
  local rate = st.rate < ceiling and st.rate or ceiling
  local floor = s.floor < ceiling and s.floor or ceiling
  local at_floor = rate <= floor
  local clean, signals, refused, failed, last = report[1], report[2], report[3], report[4], report[5]
  if signals > 0 then
    local factor = st.slow and s.exit or s.dec
    st.slow = false
    if st.cut_at == nil or now - st.cut_at >= s.cool - 0.05 then
      local cut = rate * factor
      rate = cut > floor and cut or floor
      st.cut_at = now
    end
    st.climb_at = now
  elseif clean > 0 then
    if st.slow then
      rate = rate + s.gain * clean
    else
      local share = s.share * rate
      local increase = share > s.inc and share or s.inc
      local elapsed = 0.0
      if st.climb_at ~= nil and now > st.climb_at then elapsed = now - st.climb_at end
      if elapsed > s.gap then elapsed = s.gap end
      rate = rate + increase * elapsed
    end
    if rate >= ceiling then rate = ceiling; st.slow = false end
    st.climb_at = now
  end
  st.rate = rate
  -- The breaker.
  if at_floor then failed = failed + refused end
  if last ~= 0 then st.last = last end
  if last == 1 then
    st.fails, st.since, st.halts = 0, nil, 0
  elseif failed > 0 then
    st.fails = st.fails + failed
    if st.since == nil then st.since = now end
    if st.fails >= s.after then
      local halt_s = s.base * 2.0 ^ st.halts
      st['until'] = now + (halt_s < s.max and halt_s or s.max)
      st.halts, st.fails = st.halts + 1, s.after - 1
    end
    if st.gone == nil and now - st.since >= s.giveup then st.gone = now end
  end
end

local function flag_of(st)
  if st.halt ~= nil then return 'm' end
  if st.gone ~= nil then return 'g' end
  if st['until'] ~= nil and st['until'] > now then return 'h' end
  return ''
end

-- hosts.py's DELAY_SHARE: a Crawl-delay's slots are the delay over it apart.
local DELAY_SHARE = 0.95

local function interval_of(st, ceiling)
  local rate = (st.rate ~= nil and st.rate < ceiling) and st.rate or ceiling
  local interval = 1 / rate
  local delay = st.delay
  if delay ~= nil and delay > interval and delay ~= math.huge
      and st.delay_until ~= nil and st.delay_until > now then
    return delay / DELAY_SHARE
  end
  return interval
end

local function renew(st)
  if st.halt ~= nil or st.override ~= nil then st.expires = nil; return end
  local needed = now + s.idle
  if st.next_at ~= nil and st.next_at + s.idle > needed then needed = st.next_at + s.idle end
  if st['until'] ~= nil and st['until'] + s.idle > needed then needed = st['until'] + s.idle end
  if st.gone ~= nil and st.gone + s.giveup > needed then needed = st.gone + s.giveup end
  if st.expires == nil or needed - st.expires > s.idle / 2 then st.expires = needed end
end

-- The host index's band (contract.HOST_INDEX_BAND), and each why's state's place in it
-- (contract.HOST_WHY, HOST_STATES).
local BAND = 1e10
local WHY_BAND = {pace = 0, slow = 1, delay = 1, cap = 1, climb = 1, cut = 2, halt = 3, op = 3,
  gone = 3}

-- host_why: why the host is paced as it is (contract.HOST_WHY).
local function why_of(st, flag, ceiling, source_rps, interval)
  if flag == 'm' then return 'op' end
  if flag == 'g' then return 'gone' end
  if flag == 'h' then return 'halt' end
  if not (interval > 1 / source_rps) then return 'pace' end
  local rate = (st.rate ~= nil and st.rate < ceiling) and st.rate or ceiling
  if interval > 1 / rate then return 'delay' end
  if not (rate < ceiling) then return 'cap' end
  if st.slow then return 'slow' end
  if st.cut_at ~= nil then return 'cut' end
  return 'climb'
end

-- indexed: whether the host's member of its source's host index is due.
local function index_due(st, why)
  local seen = st.seen
  return not (st.why == why and seen ~= nil and now - seen >= 0 and now - seen < s.refresh)
end

local function zadd_all(key, members)
  for first = 1, #members, 2000 do
    local last = math.min(first + 1999, #members)
    local reply = redis.pcall('ZADD', key, unpack(members, first, last))
    if type(reply) == 'table' and reply.err then
      redis.call('DEL', key)  -- not a sorted set (written by hand): overwritten
      redis.call('ZADD', key, unpack(members, first, last))
    end
  end
end

-- Writes the due members of a source's host index, removes the members idle for idle_s
-- from each band written, and has the index expire idle_s from now.
local function write_index(source, members, bands)
  if #members == 0 then return end
  local key = s.ix .. source
  zadd_all(key, members)
  for band in pairs(bands) do
    local low = band * BAND
    redis.call('ZREMRANGEBYSCORE', key, string.format('%.17g', low),
      '(' .. string.format('%.17g', low + now - s.idle))
  end
  redis.call('PEXPIRE', key, math.ceil(s.idle * 1000))
end

local function time(v) if v == nil then return '' end return string.format('%.6f', v) end
local function time3(v) if v == nil then return '' end return string.format('%.3f', v) end
local function exact(v) if v == nil then return '' end return string.format('%.17g', v) end
local function count(v) if v == 0 then return '' end return tostring(v) end

local function fields(st)
  return {
    next = time(st.next_at), rate = exact(st.rate), ss = st.slow and '1' or '',
    cut = time(st.cut_at), climb = time(st.climb_at), delay = exact(st.delay),
    delay_until = time(st.delay_until), fails = count(st.fails), since = time(st.since),
    ['until'] = time(st['until']), halts = count(st.halts), gone = time(st.gone),
    halt = st.halt or '', override = exact(st.override), exp = time(st.expires),
    last = count(st.last), why = st.why or '', seen = time3(st.seen),
  }
end

local function write_host(key, st, before, old_expires)
  local changed = {}
  for name, value in pairs(fields(st)) do
    if (before[name] or '') ~= value then
      changed[#changed + 1] = name
      changed[#changed + 1] = value
    end
  end
  if #changed > 0 then redis.call('HSET', key, unpack(changed)) end
  if st.expires ~= old_expires then
    if st.expires == nil then
      redis.call('PERSIST', key)
    else
      redis.call('PEXPIRE', key, math.ceil((st.expires - now) * 1000))
    end
  end
end

local answers = {}
for i, ask in ipairs(cjson.decode(ARGV[2])) do
  local source, hosts = ask[1], ask[2]
  local raw = redis.pcall('GET', config.rp .. source)
  local rate = type(raw) == 'string' and tonumber(raw) or nil
  if rate == nil or rate ~= rate or rate <= 0 or rate == math.huge then
    answers[i] = false
  else
    local host_rate = redis.pcall('GET', config.cp .. source)
    host_rate = type(host_rate) == 'string' and tonumber(host_rate) or nil
    if host_rate ~= nil and host_rate ~= host_rate then host_rate = nil end
    local src_key = config.np .. source
    local stored = redis.pcall('GET', src_key)
    local src = type(stored) == 'string' and tonumber(stored) or now
    if src ~= src or src < now then src = now end
    local states, befores, expires, keys, flags, intervals, wanted, slots, host_next, whys =
      {}, {}, {}, {}, {}, {}, {}, {}, {}, {}
    local unread, limit, moved = {}, now + horizon, false
    -- Hosts are read as the round robin's first pass reaches them: one with nothing to
    -- report, reached once the source has no slot left within the horizon, is not read.
    for j, h in ipairs(hosts) do
      local report = h[3]
      slots[j] = {}
      if report[5] == 0 and report[2] == 0 and src > limit then
        unread[j] = true
        host_next[j] = now
      else
        local key = config.hp .. source .. ':' .. h[1]
        local st, before = read_host(key)
        expires[j] = st.expires
        local ceiling = ceiling_of(rate, host_rate, st.override)
        if report[5] ~= 0 or report[2] > 0 or st.rate == nil then step(st, report, ceiling) end
        keys[j], states[j], befores[j] = key, st, before
        flags[j] = flag_of(st)
        intervals[j] = interval_of(st, ceiling)
        whys[j] = why_of(st, flags[j], ceiling, rate, intervals[j])
        wanted[j] = flags[j] == '' and h[2] or 0
        local n = st.next_at
        host_next[j] = (n ~= nil and n >= now) and n or now
        local at = src > host_next[j] and src or host_next[j]
        if wanted[j] > 0 and at <= limit then  -- the first pass
          slots[j][1] = at - now
          src = at + 1 / rate
          host_next[j] = at + intervals[j]
          moved = true
        end
      end
    end
    -- The further passes: one slot per host per pass, while any gets one within the
    -- horizon.
    local open = {}
    for j = 1, #hosts do
      if not unread[j] and #slots[j] == 1 and wanted[j] > 1 then open[#open + 1] = j end
    end
    while #open > 0 do
      local still = {}
      for _, j in ipairs(open) do
        local at = src > host_next[j] and src or host_next[j]
        if at <= limit then
          slots[j][#slots[j] + 1] = at - now
          src = at + 1 / rate
          host_next[j] = at + intervals[j]
          if #slots[j] < wanted[j] then still[#still + 1] = j end
        end
      end
      open = still
    end
    local answer, members, bands = {}, {}, {}
    for j = 1, #hosts do
      local st = states[j]
      if unread[j] then
        answer[j] = {src - horizon - now, {}, -1, ''}
      else
        if #slots[j] > 0 then st.next_at = host_next[j] end
        renew(st)
        if index_due(st, whys[j]) then
          st.why, st.seen = whys[j], now
          local band = WHY_BAND[whys[j]]
          members[#members + 1] = string.format('%.3f', band * BAND + now)
          members[#members + 1] = hosts[j][1]
          bands[band] = true
        end
        write_host(keys[j], st, befores[j], expires[j])
        local flag = flags[j]
        local next_s = -1
        if flag == 'h' then
          next_s = st['until'] - now
        elseif flag == '' then
          next_s = (src > host_next[j] and src or host_next[j]) - horizon - now
        end
        answer[j] = {next_s, slots[j], intervals[j], flag}
      end
    end
    write_index(source, members, bands)
    if moved then
      redis.call('SET', src_key, string.format('%.6f', src), 'PX', math.ceil((src - now) * 1000) + 1000)
    end
    answers[i] = answer
  end
end
-- Redis' own clock beside the answers: a worker whose clock agrees with it places the slots
-- by it, not by a guess within its round trip (pacing.py, redis_loop_time).
return cjson.encode({t = clock[1] .. '.' .. string.format('%06d', tonumber(clock[2])), a = answers})
