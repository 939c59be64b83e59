-- The probe calls of one pool already in the warehouse, with their status: a probe run skips
-- these keys (and reissues the transient ones). Parameters: $pool.
SELECT call_id, status
FROM calls
WHERE kind = 'probe' AND pool = $pool;
