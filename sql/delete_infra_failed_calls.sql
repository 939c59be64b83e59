-- Drop the calls of one evaluation run's top-level workflows that ended as infrastructure
-- failures, and of every workflow nested in them (run before delete_infra_failed_workflows, which
-- drops the rows these calls are found by): a rerun executes those workflows again, and keys the
-- retry would not reach (another recursive path) must not stay behind. Parameters: $run_id.
DELETE FROM calls
WHERE run_id = $run_id
  AND workflow_id IN (
      SELECT workflow_id
      FROM workflows
      WHERE run_id = $run_id
        AND coalesce(root_workflow_id, workflow_id) IN (
            SELECT workflow_id FROM workflows
            WHERE run_id = $run_id AND parent_workflow_id IS NULL AND infra_failure
        )
  );
