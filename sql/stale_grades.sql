-- How many verdicts were given by another grader than the current one, in `calls` and in
-- `workflows`. Parameters: $version (the current grader), $pool and $run_id (NULL: any).
-- A workflow belongs to a pool through its calls.
SELECT
    (
        SELECT count(*)
        FROM calls
        WHERE correct IS NOT NULL
          AND grader_version IS DISTINCT FROM $version
          AND ($pool IS NULL OR pool = $pool)
          AND ($run_id IS NULL OR run_id = $run_id)
    ) AS calls,
    (
        SELECT count(*)
        FROM workflows
        WHERE correct IS NOT NULL
          AND grader_version IS DISTINCT FROM $version
          AND ($pool IS NULL OR workflow_id IN (SELECT workflow_id FROM calls WHERE pool = $pool))
          AND ($run_id IS NULL OR run_id = $run_id)
    ) AS workflows;
