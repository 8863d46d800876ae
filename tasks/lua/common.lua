-- Shared by every onelane script (store.py prepends it, after NAMES: the key names and prefixes of
-- tasks/keys.py, in the order of keys.prefixes(), written into the script so no call has to send them).
local JOB, OUT, EV, CH, UQ, UJ, WATCH, QUEUE, WAITING, MOVED, IN_PROGRESS, SERVICE_TIMES, VTIME, TAGS, SEQ,
  DEVICE, DEVICES, STATS, CANCELS = unpack(NAMES)
local A = 0 -- the script's own arguments start at ARGV[A + 1]
local TIE = 16777216 -- queue score = start tag * TIE + admission counter (mod TIE)

local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1e6
end

local function fmt(t)
  return string.format('%.6f', t)
end

-- Give `key` the same remaining life as the job record, so no key outlives its job.
local function same_life(key, id)
  redis.call('EXPIRE', key, math.max(redis.call('TTL', JOB .. id), 1))
end

-- Make `key` live at least `life` seconds (EXPIRE GT treats a key without TTL as infinite).
local function extend(key, life)
  if redis.call('TTL', key) < life then redis.call('EXPIRE', key, life) end
end

-- Append one event to the job's durable log and publish it live with its index in the log.
local function emit(id, event_json)
  local n = redis.call('RPUSH', EV .. id, event_json)
  if n == 1 then same_life(EV .. id, id) end
  redis.call('PUBLISH', CH .. id, '{"i":' .. (n - 1) .. ',"e":' .. event_json .. '}')
  return n - 1
end

local function error_json(type_, message)
  return cjson.encode({type = type_, message = message})
end

-- Counters and histograms behind /metrics (a histogram keeps one field per bucket's upper bound).
local BUCKETS = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

local function stat(field, n)
  redis.call('HINCRBY', STATS, field, n or 1)
  redis.call('EXPIRE', STATS, 2592000)
end

local function observe(name, value)
  local le = '+Inf'
  for _, b in ipairs(BUCKETS) do
    if value <= b then le = tostring(b); break end
  end
  stat('h:' .. name .. ':' .. le)
  redis.call('HINCRBYFLOAT', STATS, 'h:' .. name .. ':sum', value)
end

-- End a job. Every key of an ended job lives for result_ttl seconds from now. The terminal event carries the
-- finish reason and token counts, so that a stream can close without reading the job back.
local function finish(id, status, finish_reason, error_json_, result_ttl, t)
  local jkey = JOB .. id
  stat('finished:' .. status)
  redis.call('ZREM', IN_PROGRESS, id)
  redis.call('HSET', jkey, 'status', status, 'finished_at', fmt(t))
  if finish_reason ~= '' then redis.call('HSET', jkey, 'finish_reason', finish_reason) end
  if error_json_ ~= '' then redis.call('HSET', jkey, 'error', error_json_) end
  local n = redis.call('HMGET', jkey, 'prompt_tokens', 'completion_tokens')
  emit(id, cjson.encode({type = status, finish_reason = finish_reason ~= '' and finish_reason or nil,
    prompt_tokens = tonumber(n[1]) or 0, completion_tokens = tonumber(n[2]) or 0}))
  for _, k in ipairs({jkey, OUT .. id, EV .. id}) do redis.call('EXPIRE', k, result_ttl) end
end

local function virtual_time()
  return tonumber(redis.call('GET', VTIME) or '0')
end

-- Mean of the recent service times, and what is left of the running job: once it produces tokens, its
-- remaining tokens at its own rate (an upper bound: EOS may come first), else the mean less its age. Until a
-- job has been timed, the running job's age stands in for the mean (it took this long; assume as long again).
local function service_estimate(t)
  local times = redis.call('LRANGE', SERVICE_TIMES, 0, -1)
  local running = redis.call('ZRANGE', IN_PROGRESS, 0, 0, 'WITHSCORES')
  local started = tonumber(running[2] or '')
  local mean = 1.0
  if #times > 0 then
    local sum = 0
    for _, x in ipairs(times) do sum = sum + tonumber(x) end
    mean = sum / #times
  elseif started then
    mean = math.max(1.0, t - started)
  end
  local left = 0
  if started then
    local f = redis.call('HMGET', JOB .. running[1], 'max_tokens', 'completion_tokens', 'first_token_at')
    local done, first = tonumber(f[2] or '0'), tonumber(f[3] or '')
    if first and done > 0 and tonumber(f[1] or '') then
      left = math.max(0, tonumber(f[1]) - done) * (t - first) / done
    elseif #times > 0 then
      left = math.max(0, mean - (t - started))
    else
      left = mean
    end
  end
  return mean, left, started ~= nil, #times
end

-- Take a waiting job out of the queue (cancelled or expired: it will not run). If that empties its owner's
-- queue, its owner's next start tag is capped at one round after now, so cancelling costs no future turns.
local function unqueue(id, owner)
  redis.call('ZREM', WAITING, id)
  redis.call('ZREM', QUEUE, id)
  local q = UQ .. owner
  if redis.call('ZREM', q, id) == 1 and redis.call('ZCARD', q) == 0 then
    local cap = virtual_time() + 1
    if tonumber(redis.call('HGET', TAGS, owner) or '0') > cap then redis.call('HSET', TAGS, owner, cap) end
  end
  redis.call('PUBLISH', MOVED, id)
end

-- A running job whose worker is gone (or could not record its outcome) goes back to the front of the queue
-- with its original score, output cleared and a `requeued` event; after max_attempts it ends failed
-- instead, so a prompt that kills the worker every time is quarantined. A job asked to stop just ends.
local function release(id, max_attempts, ttl, result_ttl, why)
  local jkey = JOB .. id
  local f = redis.call('HMGET', jkey, 'status', 'attempts', 'cancel_requested', 'owner', 'score', 'deadline')
  redis.call('ZREM', IN_PROGRESS, id)
  if f[1] ~= 'in_progress' then return 'ended' end
  local t = now()
  if f[3] then
    finish(id, 'cancelled', 'cancelled', redis.call('HGET', jkey, 'cancel_error') or '', result_ttl, t)
    return 'cancelled'
  end
  if tonumber(f[2]) >= max_attempts then
    finish(id, 'failed', '', error_json(why, 'the worker died while running this job, ' .. f[2] .. ' times'),
      result_ttl, t)
    return 'failed'
  end
  local deadline = math.max(tonumber(f[6]), t + ttl)
  redis.call('HSET', jkey, 'status', 'queued', 'deadline', fmt(deadline), 'completion_tokens', 0)
  redis.call('HDEL', jkey, 'started_at', 'first_token_at', 'last_token_at', 'worker', 'device')
  redis.call('DEL', OUT .. id)
  redis.call('EXPIRE', jkey, math.ceil(deadline - t + result_ttl))
  redis.call('ZADD', QUEUE, f[5], id)
  redis.call('ZADD', UQ .. f[4], f[5], id)
  redis.call('ZADD', WAITING, deadline, id)
  emit(id, '{"type":"requeued","attempt":' .. f[2] .. '}')
  redis.call('PUBLISH', MOVED, id)
  stat('requeued')
  return 'requeued'
end

-- End a waiting job whose deadline passed as `expired`.
local function expire_waiting(id, result_ttl, t)
  local f = redis.call('HMGET', JOB .. id, 'status', 'owner')
  if f[1] == 'queued' then
    unqueue(id, f[2])
    finish(id, 'expired', '', error_json('expired', 'the job waited past its deadline and was never started'),
      result_ttl, t)
  else
    redis.call('ZREM', WAITING, id)
  end
end

-- A running job is orphaned when the worker that claimed it no longer holds its device.
local function orphaned(id)
  local f = redis.call('HMGET', JOB .. id, 'worker', 'device')
  if not f[1] or not f[2] then return true end
  return redis.call('HGET', DEVICE .. f[2], 'worker') ~= f[1]
end
