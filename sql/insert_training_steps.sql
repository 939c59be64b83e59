-- Idempotent batch write: rows whose key already exists are skipped, so a rerun adds nothing twice.
INSERT OR IGNORE INTO training_steps BY NAME SELECT * FROM batch;
