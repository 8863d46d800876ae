-- The supervisor's look at a device, in one command: the pid of the process holding its lease, and the job
-- it ended as failed (stalled) because that job, still running there, made no progress (started, or a
-- token) for `stall_s` seconds by Redis's clock.
-- ARGV: device, stall_s, result_ttl_s  ->  {holder pid or false, stalled job id or false}
local device, stall_s, result_ttl = ARGV[A + 1], tonumber(ARGV[A + 2]), tonumber(ARGV[A + 3])
local d = redis.call('HMGET', DEVICE .. device, 'job', 'worker', 'pid')
if not d[1] or d[1] == '' then return {d[3] or false, false} end
local f = redis.call('HMGET', JOB .. d[1], 'status', 'worker', 'started_at', 'last_token_at')
if f[1] ~= 'in_progress' or f[2] ~= d[2] then return {d[3], false} end
local t = now()
if t - tonumber(f[4] or f[3]) < stall_s then return {d[3], false} end
finish(d[1], 'failed', '', error_json('stalled', 'no token for ' .. stall_s .. ' s; the worker was restarted'),
  result_ttl, t)
return {d[3], d[1]}
