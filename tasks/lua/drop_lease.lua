-- Free a device held by a worker that is done with it: a process known to be dead (its supervisor reaped it), or
-- a worker that stopped in good order, so a standby can take it at once instead of waiting for the lease to lapse.
-- ARGV: device, 'pid' or 'worker', its value  ->  1 if dropped, 0 if someone else holds it (or nobody does)
local key = DEVICE .. ARGV[A + 1]
if redis.call('HGET', key, ARGV[A + 2]) == ARGV[A + 3] then return redis.call('DEL', key) end
return 0
