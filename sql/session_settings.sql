-- Run on every warehouse connection. The `calls.started_at` column is a naive TIMESTAMP in UTC;
-- with the session in UTC, a timezone-aware value is stored as UTC whatever the host's zone
-- (under the default, DuckDB converts it to the host's local time on insert).
SET TimeZone = 'UTC';
