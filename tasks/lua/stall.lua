-- End a job as failed (stalled) if it is still running on `worker` and made no progress (started, or a
-- token) for `stall_s` seconds by Redis's clock. ARGV: device, stall_s, result_ttl_s  ->  the job id, or false
local device, stall_s, result_ttl = ARGV[A + 1], tonumber(ARGV[A + 2]), tonumber(ARGV[A + 3])
local d = redis.call('HMGET', DEVICE .. device, 'job', 'worker')
if not d[1] or d[1] == '' then return false end
local f = redis.call('HMGET', JOB .. d[1], 'status', 'worker', 'started_at', 'last_token_at')
if f[1] ~= 'in_progress' or f[2] ~= d[2] then return false end
local t = now()
local progress = tonumber(f[4] or f[3])
if t - progress < stall_s then return false end
finish(d[1], 'failed', '', error_json('stalled', 'no token for ' .. stall_s .. ' s; the worker was restarted'),
  result_ttl, t)
return d[1]
