-- Idempotent batch write: rows whose key already exists are skipped, so a rerun adds nothing twice.
INSERT OR IGNORE INTO questions BY NAME SELECT * FROM batch;
