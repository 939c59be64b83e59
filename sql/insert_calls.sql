-- Idempotent batch write: rows whose key already exists are skipped, so a rerun adds nothing twice.
-- One exception: a transient fault (never scored) gives way to the reissued call's row. Both
-- statements run in one transaction, so a kill leaves either the old row or the new one.
DELETE FROM calls WHERE status = 'transient' AND call_id IN (SELECT call_id FROM batch);
INSERT OR IGNORE INTO calls BY NAME SELECT * FROM batch;
