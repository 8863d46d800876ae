-- One round of housekeeping, in one command; every web process and the worker run it every second, so it
-- happens whether or not a worker is alive. It ends waiting jobs that must not run (past their deadline:
-- `expired`; their watcher's lease lapsed: `cancelled`, client_gone), releases running jobs whose worker lost
-- its device (see release() in common.lua), and rings the worker's doorbell if jobs wait and none is pending
-- (a message lost with a worker, or jobs requeued).
-- ARG: max_attempts, ttl_s, result_ttl_s, limit, message queue key, message hash key, message id, message
-- -> {waiting, id, verdict, id, verdict, ...}
local max_attempts, ttl, result_ttl, limit = tonumber(ARG.max_attempts), tonumber(ARG.ttl_s), tonumber(ARG.result_ttl_s),
  tonumber(ARG.limit)
local t = now()
local function sweep(index, status, reason, type_, message)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', index, '-inf', fmt(t), 'LIMIT', 0, limit)) do
    if redis.call('HGET', JOB .. id, 'status') == 'queued' then
      drop(id, status, reason, error_json(type_, message), result_ttl, t)
    else
      redis.call('ZREM', index, id)
    end
  end
end
sweep(WAITING, 'expired', '', 'expired', EXPIRED)
sweep(WATCHED, 'cancelled', 'cancelled', 'client_gone', CLIENT_GONE)
local out = {0}
local lost, with = {}, {} -- the orphaned jobs in their start order, and how many each one's worker ran
for _, id in ipairs(redis.call('ZRANGE', IN_PROGRESS, 0, -1)) do
  if orphaned(id) then
    local worker = redis.call('HGET', JOB .. id, 'worker') or ''
    lost[#lost + 1] = {id, worker}
    with[worker] = (with[worker] or 0) + 1
  end
end
for _, job in ipairs(lost) do
  table.insert(out, job[1])
  table.insert(out, release(job[1], max_attempts, ttl, result_ttl, 'worker_crashed', with[job[2]] > 1))
end
out[1] = redis.call('ZCARD', QUEUE)
if out[1] > 0 then ring(ARG.bell_queue, ARG.bell_messages, ARG.bell_id, ARG.bell) end
return out
