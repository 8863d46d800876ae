-- Free a device held by a worker that is done with it: a process known to be dead (its supervisor reaped it), or
-- a worker that stopped in good order, so a standby can take it at once instead of waiting for the lease to lapse.
-- A process dropped by its pid is dead: if it holds the lease, or held it lately (it lapsed before its supervisor
-- reaped it), its record says so, and the run of each job its lapse handed back uncounted is counted now (see
-- hand_back() in housekeep.lua; a worker that woke after its lapse was late, not dead, and has no such job left).
-- A process its supervisor killed for losing the device (died 0: late or hung, not known) is not marked dead: the
-- runs its lapse handed back are counted at their next hand-back unless it woke (it never will).
-- ARG: device, 'pid' or 'worker', its value, died (1/0)  ->  1 if dropped, 0 if someone else holds it (or nobody does)
local key = DEVICE .. ARG.device
local f = redis.call('HMGET', key, ARG.field, 'worker')
if ARG.field == 'pid' and ARG.died == '1' then
  local dead = f[1] == ARG.value and f[2]
  for _, held in ipairs(redis.call('LRANGE', HOLDERS .. ARG.device, 0, -1)) do
    local pid, worker = string.match(held, '^(%S+) (%S+)$')
    if not dead and pid == ARG.value then dead = worker end
  end
  if dead then
    local record = WORKER .. dead
    redis.call('HSET', record, 'dead', fmt(now()))
    for id in string.gmatch(redis.call('HGET', record, 'lost') or '', '[^,]+') do
      local j = redis.call('HMGET', JOB .. id, 'lapsed', 'status')
      if j[1] == dead then
        redis.call('HDEL', JOB .. id, 'lapsed')
        if j[2] == 'queued' or j[2] == 'in_progress' then redis.call('HINCRBY', JOB .. id, 'attempts', 1) end
      end
    end
    redis.call('EXPIRE', record, WORKER_RECORD_TTL)
  end
end
if f[1] ~= ARG.value then return 0 end
return redis.call('DEL', key)
