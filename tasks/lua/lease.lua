-- Take or renew a device's lease for one worker: one worker generates on a device at a time, even across
-- processes. Besides the holder, its hash keeps `progress`: when the holder last started a job or produced a
-- token (claim.lua, append.lua), for health checks. ARGV: device, worker_id, pid, lease_ms  ->  'ok', or the id of the worker that holds it
local device, worker, pid, lease_ms = ARGV[A + 1], ARGV[A + 2], ARGV[A + 3], tonumber(ARGV[A + 4])
local key = DEVICE .. device
local holder = redis.call('HGET', key, 'worker')
if holder and holder ~= worker then return holder end
local t = redis.call('TIME')
if not holder then redis.call('HSET', key, 'worker', worker, 'pid', pid, 'since', t[1] .. '.' .. t[2]) end
redis.call('HSET', key, 'beat', string.format('%d.%06d', t[1], t[2]))
redis.call('PEXPIRE', key, lease_ms)
redis.call('SADD', DEVICES, device)
redis.call('EXPIRE', DEVICES, 2592000)
return 'ok'
