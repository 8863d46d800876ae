-- The supervisor's look at a device, in one command: the pid of the process holding its lease, and the jobs it
-- ended as failed (stalled) because, running there, they made no progress (started, a token, or a step that read
-- their prompt on) for `stall_s` seconds by Redis's clock; or because the step on the device has run past the
-- limit the holder gave it (its model's measured pace, many times over: worker/step_watch.py), which is sooner.
-- ARG: device, stall_s, result_ttl_s  ->  {holder pid or false, stalled job id...}
local device, stall_s, result_ttl = ARG.device, tonumber(ARG.stall_s), tonumber(ARG.result_ttl_s)
local d = redis.call('HMGET', DEVICE .. device, 'worker', 'pid', 'step_s', 'step_limit')
local out = {d[2] or false}
if not d[1] then return out end
local t = now()
local step_s, limit = tonumber(d[3] or '') or 0, tonumber(d[4] or '') or 0
-- as the holder's heartbeat last said it: a live process whose step does not end (a frozen one says nothing, and
-- its lease lapses first: its jobs are handed back, not failed)
local stuck = step_s > 0 and limit > 0 and step_s >= limit
local why = stuck and string.format('a step of its batch has run over %g s, many times what its steps take here; '
  .. 'the worker was restarted', limit) or ('no token for ' .. stall_s .. ' s; the worker was restarted')
for _, id in ipairs(redis.call('ZRANGE', IN_PROGRESS, 0, -1)) do
  local f = redis.call('HMGET', JOB .. id, 'worker', 'started_at', 'last_token_at', 'progress_at')
  local progress = math.max(tonumber(f[2]) or 0, tonumber(f[3]) or 0, tonumber(f[4]) or 0)
  if f[1] == d[1] and (stuck or t - progress >= stall_s) then
    finish(id, 'failed', '', error_json('stalled', why), result_ttl, t)
    table.insert(out, id)
  end
end
return out
