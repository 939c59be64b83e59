-- Drop one evaluation run's top-level workflows that ended as infrastructure failures and the
-- workflows nested in them (their calls first, with delete_infra_failed_calls), so a rerun of
-- the run executes them again. Returns one row per deleted workflow (whether it was a top-level
-- one). Parameters: $run_id.
DELETE FROM workflows
WHERE run_id = $run_id
  AND coalesce(root_workflow_id, workflow_id) IN (
      SELECT workflow_id FROM workflows
      WHERE run_id = $run_id AND parent_workflow_id IS NULL AND infra_failure
  )
RETURNING parent_workflow_id IS NULL AS top_level;
