-- Write re-graded verdicts over the stale ones (relation `regraded`: call_id, extracted_answer,
-- correct). Only rows still stale are touched, so a concurrent writer's new rows stay as written.
-- Parameters: $version (the current grader).
UPDATE calls
SET extracted_answer = regraded.extracted_answer,
    correct = regraded.correct,
    grader_version = $version
FROM regraded
WHERE calls.call_id = regraded.call_id
  AND calls.correct IS NOT NULL
  AND calls.grader_version IS DISTINCT FROM $version;
