-- A fingerprint of a pool's probe calls: it changes when a call is added, replaced (a transient
-- call retried) or regraded, and stays the same when a rerun writes nothing. `probe_calls` returns
-- it as its data version, so pass rates and everything after them go stale exactly when the
-- probes they read change.
-- Parameters: $pool.
SELECT count(*) AS calls,
       md5(coalesce(string_agg(
           concat_ws('|', call_id, status, coalesce(CAST(correct AS VARCHAR), '-'),
                     coalesce(extracted_answer, '-'), coalesce(grader_version, '-')),
           chr(10) ORDER BY call_id), '')) AS digest
FROM calls
WHERE kind = 'probe' AND pool = $pool;
