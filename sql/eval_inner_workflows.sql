-- The workflows a conductor seat wrote inside the top-level workflows of one evaluation run
-- (recursion): one row per reply of the conductor at a recursive step, with the top-level
-- workflow it belongs to (`root_workflow_id`), the step that called it and its depth. A reply of
-- three empty lists (pass the answer through) has n_steps = 0. Parameters: $run_id.
SELECT workflow_id, root_workflow_id, parent_workflow_id, parent_step, depth, question_id, arm, repeat,
       parse_code, n_steps, workers, final_answer, correct, infra_failure
FROM workflows
WHERE run_id = $run_id AND parent_workflow_id IS NOT NULL
ORDER BY arm, repeat, question_id, depth, workflow_id;
