-- Take or renew a device's lease for one worker: one worker generates on a device at a time, even across
-- processes. Besides the holder, its hash keeps `progress`: when the holder last started a job or produced a
-- token (claim.lua, append.lua), for health checks; and what the holder reports of its batch with each renewal:
-- `batch` (jobs in it), `slots` (its size), `tok_s` (tokens generated per second lately), for /metrics, whose
-- counters of decode and prefill work it also adds to; `models` (the models it has loaded, comma-separated),
-- `active` (the model its batch runs) and `loading` (the model it loads now), for ETAs and health checks.
-- To `take` a lease is to get it if it is free; to `renew` one is to keep a lease still held: a worker whose lease
-- lapsed (its jobs may have been taken back meanwhile, and run again elsewhere) is told 'lapsed' and must stop.
-- ARGV: device, worker_id, pid, lease_ms, 'take' or 'renew'[, batch, slots, tok_s, steps, decode_s, prefill_s,
--       prefill_tokens, models, active, loading, cache_lookups, cache_hits, cache_tokens, cache_bytes, cache_entries]
-- (the prefix cache's lookups, hits and prompt tokens read from it since the last report; what it holds now)
--   ->  'ok', 'lapsed', or the id of the worker that holds it
local device, worker, pid, lease_ms = ARGV[A + 1], ARGV[A + 2], ARGV[A + 3], tonumber(ARGV[A + 4])
local key = DEVICE .. device
local holder = redis.call('HGET', key, 'worker')
if holder and holder ~= worker then return holder end
if not holder and ARGV[A + 5] == 'renew' then return 'lapsed' end
local t = redis.call('TIME')
if not holder then redis.call('HSET', key, 'worker', worker, 'pid', pid, 'since', t[1] .. '.' .. t[2]) end
redis.call('HSET', key, 'beat', string.format('%d.%06d', t[1], t[2]))
if ARGV[A + 6] then
  redis.call('HSET', key, 'batch', ARGV[A + 6], 'slots', ARGV[A + 7], 'tok_s', ARGV[A + 8])
  stat('batch_steps', tonumber(ARGV[A + 9]))
  redis.call('HINCRBYFLOAT', STATS, 'decode_seconds', ARGV[A + 10])
  redis.call('HINCRBYFLOAT', STATS, 'prefill_seconds', ARGV[A + 11])
  stat('prefill_tokens', tonumber(ARGV[A + 12]))
  redis.call('HSET', key, 'models', ARGV[A + 13], 'active', ARGV[A + 14], 'loading', ARGV[A + 15])
  stat('cache_lookups', tonumber(ARGV[A + 16]))
  stat('cache_hits', tonumber(ARGV[A + 17]))
  stat('cache_tokens', tonumber(ARGV[A + 18]))
  redis.call('HSET', key, 'cache_bytes', ARGV[A + 19], 'cache_entries', ARGV[A + 20])
end
redis.call('PEXPIRE', key, lease_ms)
redis.call('SADD', DEVICES, device)
redis.call('EXPIRE', DEVICES, 2592000)
return 'ok'
