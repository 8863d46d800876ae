-- Free a device held by a worker that is done with it: a process known to be dead (its supervisor reaped it), or
-- a worker that stopped in good order, so a standby can take it at once instead of waiting for the lease to lapse.
-- ARG: device, 'pid' or 'worker', its value  ->  1 if dropped, 0 if someone else holds it (or nobody does)
local key = DEVICE .. ARG.device
if redis.call('HGET', key, ARG.field) == ARG.value then return redis.call('DEL', key) end
return 0
