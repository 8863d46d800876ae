-- Shared by every onelane script (store.py prepends it). Key prefixes come from tasks/keys.py as ARGV[1..12].
local JOB, OUT, EV, CH, UQ, UJ, RING, WAITING, MOVED, RUNNING, SERVICE_TIMES, WATCH =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12]
local A = 12 -- the script's own arguments start at ARGV[A + 1]

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

-- Append one event to the job's durable log and publish it live with its index in the log.
local function emit(id, event_json)
  local n = redis.call('RPUSH', EV .. id, event_json)
  if n == 1 then same_life(EV .. id, id) end
  redis.call('PUBLISH', CH .. id, '{"i":' .. (n - 1) .. ',"e":' .. event_json .. '}')
  return n - 1
end

-- End a job. Every key of an ended job lives for result_ttl seconds from now.
local function finish(id, status, finish_reason, error_json, result_ttl, t)
  local jkey = JOB .. id
  redis.call('HSET', jkey, 'status', status, 'finished_at', fmt(t))
  if finish_reason ~= '' then redis.call('HSET', jkey, 'finish_reason', finish_reason) end
  if error_json ~= '' then redis.call('HSET', jkey, 'error', error_json) end
  emit(id, '{"type":"' .. status .. '"}')
  for _, k in ipairs({jkey, OUT .. id, EV .. id}) do redis.call('EXPIRE', k, result_ttl) end
end

local function error_json(type_, message)
  return cjson.encode({type = type_, message = message})
end

-- Take a waiting job out of the queue structures and tell every waiting stream the queue moved.
local function unqueue(id, owner)
  redis.call('ZREM', WAITING, id)
  local q = UQ .. owner
  if redis.call('ZREM', q, id) == 1 and redis.call('ZCARD', q) == 0 then
    redis.call('LREM', RING, 0, owner)
  end
  redis.call('PUBLISH', MOVED, id)
end

-- Make `key` live at least `life` seconds (EXPIRE GT treats a key without TTL as infinite).
local function extend(key, life)
  if redis.call('TTL', key) < life then redis.call('EXPIRE', key, life) end
end
