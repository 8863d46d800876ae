-- Take or renew a device's lease for one worker: one worker generates on a device at a time, even across
-- processes. Besides the holder, its hash keeps `progress`: when the holder last started a job or produced a
-- token (claim.lua, append.lua), for health checks; and what the holder reports of its batch with each renewal:
-- `batch` (jobs in it), `slots` (its size), `tok_s` (tokens generated per second lately), for /metrics, whose
-- counters of decode and prefill work it also adds to; `models` (the models it has loaded, comma-separated),
-- `active` (the model its batch runs) and `loading` (the model it loads now), for ETAs and health checks.
-- To `take` a lease is to get it if it is free; to `renew` one is to keep a lease still held: a worker whose lease
-- lapsed (its jobs may have been taken back meanwhile, and run again elsewhere) is told 'lapsed' and must stop.
-- That renewal proves the worker was late, not dead: its record says it woke, and the jobs its lapse handed back
-- no longer wait to have that run counted against them (see hand_back() in housekeep.lua).
-- ARG: device, worker_id, pid, lease_ms, mode ('take' or 'renew'), and the worker's report (all '' when it
-- reports nothing): batch, slots, tok_s, steps, decode_s, prefill_s, prefill_tokens, models, active, loading,
-- cache_lookups, cache_hits, cache_tokens (the prefix cache's lookups, hits and prompt tokens read from it since
-- the last report), cache_disk_hits, cache_disk_tokens (of those, the ones read from its disk tier), cache_bytes, cache_entries (what it holds now), pace (JSON: each model's measured speed,
-- worker/pace.py), step_s and step_limit_s (how long the step on the device has run, and may: stall.lua)
--   ->  'ok', 'lapsed', or the id of the worker that holds it
local device, worker, pid, lease_ms = ARG.device, ARG.worker, ARG.pid, tonumber(ARG.lease_ms)
local key = DEVICE .. device
local holder = redis.call('HGET', key, 'worker')
if holder ~= worker and ARG.mode == 'renew' then
  local record = WORKER .. worker
  redis.call('HSET', record, 'woke', fmt(now()))
  for id in string.gmatch(redis.call('HGET', record, 'lost') or '', '[^,]+') do
    if redis.call('HGET', JOB .. id, 'lapsed') == worker then redis.call('HDEL', JOB .. id, 'lapsed') end
  end
  redis.call('EXPIRE', record, WORKER_RECORD_TTL)
  return holder or 'lapsed'
end
if holder and holder ~= worker then return holder end
local t = redis.call('TIME')
if not holder then
  redis.call('HSET', key, 'worker', worker, 'pid', pid, 'since', t[1] .. '.' .. t[2])
  redis.call('LPUSH', HOLDERS .. device, pid .. ' ' .. worker) -- (outlives the lease: drop_lease.lua)
  redis.call('LTRIM', HOLDERS .. device, 0, HOLDERS_KEPT - 1)
  redis.call('EXPIRE', HOLDERS .. device, WORKER_RECORD_TTL)
end
redis.call('HSET', key, 'beat', string.format('%d.%06d', t[1], t[2]))
if ARG.batch ~= '' then
  redis.call('HSET', key, 'batch', ARG.batch, 'slots', ARG.slots, 'tok_s', ARG.tok_s)
  stat('batch_steps', tonumber(ARG.steps))
  redis.call('HINCRBYFLOAT', STATS, 'decode_seconds', ARG.decode_s)
  redis.call('HINCRBYFLOAT', STATS, 'prefill_seconds', ARG.prefill_s)
  stat('prefill_tokens', tonumber(ARG.prefill_tokens))
  redis.call('HSET', key, 'models', ARG.models, 'active', ARG.active, 'loading', ARG.loading)
  stat('cache_lookups', tonumber(ARG.cache_lookups))
  stat('cache_hits', tonumber(ARG.cache_hits))
  stat('cache_tokens', tonumber(ARG.cache_tokens))
  stat('cache_disk_hits', tonumber(ARG.cache_disk_hits))
  stat('cache_disk_tokens', tonumber(ARG.cache_disk_tokens))
  redis.call('HSET', key, 'cache_bytes', ARG.cache_bytes, 'cache_entries', ARG.cache_entries)
  redis.call('HSET', key, 'step_s', ARG.step_s, 'step_limit', ARG.step_limit_s)
  -- each model's pace as measured here, on the device and on the model (where it outlives the lease, for ETAs),
  -- and what a generated token costs there against a prompt token read, at a full batch: its sequence's share of
  -- a step and a step's fixed cost over the slots (the fair order's output weight 'auto': admit.lua)
  redis.call('HSET', key, 'pace', ARG.pace)
  local slots = math.max(tonumber(ARG.slots) or 1, 1)
  for model, speed in pairs(cjson.decode(ARG.pace)) do
    redis.call('HSET', MODEL .. model, 'pace', cjson.encode(speed))
    local step, sequence, prompt = tonumber(speed[1]), tonumber(speed[2]), tonumber(speed[3])
    if step and sequence and prompt and prompt > 0 then
      local cost = math.min(math.max((sequence + step / slots) / prompt, TOKEN_COST_LEAST), TOKEN_COST_MOST)
      redis.call('HSET', MODEL .. model, 'token_cost', string.format('%.2f', cost))
    end
    redis.call('EXPIRE', MODEL .. model, MODEL_RECORD_TTL)
  end
end
redis.call('PEXPIRE', key, lease_ms)
redis.call('SADD', DEVICES, device)
redis.call('EXPIRE', DEVICES, 2592000)
return 'ok'
