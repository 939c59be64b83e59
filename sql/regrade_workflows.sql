-- Write re-graded workflow verdicts over the stale ones (relation `regraded`: workflow_id,
-- final_answer, correct). Parameters: $version (the current grader).
UPDATE workflows
SET final_answer = regraded.final_answer,
    correct = regraded.correct,
    grader_version = $version
FROM regraded
WHERE workflows.workflow_id = regraded.workflow_id
  AND workflows.correct IS NOT NULL
  AND workflows.grader_version IS DISTINCT FROM $version;
