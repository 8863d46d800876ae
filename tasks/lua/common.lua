-- Shared by every onelane script (store.py prepends it). Key names come from tasks/keys.py as ARGV[1..15].
local JOB, OUT, EV, CH, UQ, UJ, WATCH = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local QUEUE, WAITING, MOVED, RUNNING, SERVICE_TIMES = ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12]
local VTIME, TAGS, SEQ = ARGV[13], ARGV[14], ARGV[15]
local A = 15 -- the script's own arguments start at ARGV[A + 1]
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

-- End a job. Every key of an ended job lives for result_ttl seconds from now.
local function finish(id, status, finish_reason, error_json_, result_ttl, t)
  local jkey = JOB .. id
  redis.call('HSET', jkey, 'status', status, 'finished_at', fmt(t))
  if finish_reason ~= '' then redis.call('HSET', jkey, 'finish_reason', finish_reason) end
  if error_json_ ~= '' then redis.call('HSET', jkey, 'error', error_json_) end
  emit(id, '{"type":"' .. status .. '"}')
  for _, k in ipairs({jkey, OUT .. id, EV .. id}) do redis.call('EXPIRE', k, result_ttl) end
end

local function virtual_time()
  return tonumber(redis.call('GET', VTIME) or '0')
end

-- Mean of the recent service times (1 s until a job has been timed), and what is left of the running job.
local function service_estimate(t)
  local times = redis.call('LRANGE', SERVICE_TIMES, 0, -1)
  local mean = 1.0
  if #times > 0 then
    local sum = 0
    for _, x in ipairs(times) do sum = sum + tonumber(x) end
    mean = sum / #times
  end
  local started = tonumber(redis.call('HGET', RUNNING, 'started_at') or '')
  local left = 0
  if started then left = math.max(0, mean - (t - started)) end
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
