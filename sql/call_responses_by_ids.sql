-- The stored response of each of the given calls. Parameters: $ids (VARCHAR[]).
SELECT call_id, response
FROM calls
WHERE list_contains($ids::VARCHAR[], call_id);
