-- One round of housekeeping, in one command; every web process and the worker run it every second, so it
-- happens whether or not a worker is alive. It ends waiting jobs that must not run (past their deadline:
-- `expired`; their watcher's lease lapsed: `cancelled`, client_gone), releases running jobs whose worker lost
-- its device (see release() in common.lua, and hand_back() below), and rings the worker's doorbell if jobs wait and
-- none is pending (a message lost with a worker, or jobs requeued).
-- ARG: max_attempts, ttl_s, result_ttl_s, limit, message queue key, message hash key, message id, message
-- -> {waiting, id, verdict, id, verdict, ...}; a verdict is release()'s and what its worker was, as
--    'requeued died', 'failed late', ...: died (known dead), late (it woke), lapsed (not known yet: fate() in
--    common.lua)
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
-- A lease lapses under a worker that died, or under one whose heartbeat came late (a starved host). Only a death
-- counts as an attempt: a late worker's run is handed back as a stopping worker's is (it goes on from its tokens).
-- Which it was is often not known yet when the job goes back: that run is not counted then, but the job keeps its
-- worker's name (`lapsed`), and the count comes at the job's next hand-back here unless the worker woke meanwhile
-- (lease.lua then clears the name): a worker that never wakes (a native hang) was as good as dead. So a job whose
-- workers keep dying or hanging still fails after max_attempts, and late heartbeats never fail it.
local function hand_back(id, worker, shared)
  local jkey = JOB .. id
  local f = redis.call('HMGET', jkey, 'status', 'cancel_requested', 'attempts', 'lapsed')
  local was = fate(worker)
  if was == 'hung' then was = 'lapsed' end -- (a hang, as any lapse, is counted at the next hand-back)
  if f[1] ~= 'in_progress' or f[2] then -- (it ended, or ends cancelled: nothing to count)
    return release(id, max_attempts, ttl, result_ttl, 'worker_crashed', shared), was
  end
  local deaths = (tonumber(f[3]) or 1) - 1 -- counted before this run
  if f[4] then -- an earlier lapse whose worker never woke
    deaths = deaths + 1
    redis.call('HDEL', jkey, 'lapsed')
  end
  if was == 'died' then deaths = deaths + 1 end
  if was == 'died' or deaths >= max_attempts then
    redis.call('HSET', jkey, 'attempts', deaths)
    return release(id, max_attempts, ttl, result_ttl, 'worker_crashed', shared), was
  end
  redis.call('HSET', jkey, 'attempts', deaths + 1) -- ('stopping' takes this run off again)
  local verdict = release(id, max_attempts, ttl, result_ttl, 'stopping', shared)
  if was == 'lapsed' then
    redis.call('HSET', jkey, 'lapsed', worker)
    redis.call('HSET', WORKER .. worker, 'lost', (redis.call('HGET', WORKER .. worker, 'lost') or '') .. id .. ',')
    redis.call('EXPIRE', WORKER .. worker, WORKER_RECORD_TTL)
  end
  return verdict, was
end

for _, job in ipairs(lost) do
  local verdict, was = hand_back(job[1], job[2], with[job[2]] > 1)
  table.insert(out, job[1])
  table.insert(out, verdict .. ' ' .. was)
end
out[1] = redis.call('ZCARD', QUEUE)
if out[1] > 0 then ring(ARG.bell_queue, ARG.bell_messages, ARG.bell_id, ARG.bell) end
return out
