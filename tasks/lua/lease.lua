-- Take or renew a device's lease for one worker: one worker generates on a device at a time, even across
-- processes. Besides the holder, its hash keeps `progress`: when the holder last started a job or produced a
-- token (claim.lua, append.lua), for health checks; and what the holder reports of its batch with each renewal:
-- `batch` (jobs in it), `slots` (its size), `tok_s` (tokens generated per second lately), for /metrics, whose
-- counters of decode and prefill work it also adds to; `models` (the models it has loaded, comma-separated),
-- `active` (the model its batch runs) and `loading` (the model it loads now), for ETAs and health checks.
-- ARGV: device, worker_id, pid, lease_ms[, batch, slots, tok_s, steps, decode_s, prefill_s, prefill_tokens,
--       models, active, loading]
--   ->  'ok', or the id of the worker that holds it
local device, worker, pid, lease_ms = ARGV[A + 1], ARGV[A + 2], ARGV[A + 3], tonumber(ARGV[A + 4])
local key = DEVICE .. device
local holder = redis.call('HGET', key, 'worker')
if holder and holder ~= worker then return holder end
local t = redis.call('TIME')
if not holder then redis.call('HSET', key, 'worker', worker, 'pid', pid, 'since', t[1] .. '.' .. t[2]) end
redis.call('HSET', key, 'beat', string.format('%d.%06d', t[1], t[2]))
if ARGV[A + 5] then
  redis.call('HSET', key, 'batch', ARGV[A + 5], 'slots', ARGV[A + 6], 'tok_s', ARGV[A + 7])
  stat('batch_steps', tonumber(ARGV[A + 8]))
  redis.call('HINCRBYFLOAT', STATS, 'decode_seconds', ARGV[A + 9])
  redis.call('HINCRBYFLOAT', STATS, 'prefill_seconds', ARGV[A + 10])
  stat('prefill_tokens', tonumber(ARGV[A + 11]))
  redis.call('HSET', key, 'models', ARGV[A + 12], 'active', ARGV[A + 13], 'loading', ARGV[A + 14])
end
redis.call('PEXPIRE', key, lease_ms)
redis.call('SADD', DEVICES, device)
redis.call('EXPIRE', DEVICES, 2592000)
return 'ok'
