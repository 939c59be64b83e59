-- Remove calls by key so they can be issued again (probing reissues transient faults, which are
-- never scored). Parameters: $ids (VARCHAR[]).
DELETE FROM calls
WHERE call_id IN (SELECT unnest($ids::VARCHAR[]));
