"""The conductor: its prompt, the policies that write workflows, and the orchestrator that runs them.

`prompt` builds the conductor's chat messages (format rules, worker catalogue, examples);
`policies` turn a prompt into workflow text (a local Hugging Face model or an OpenAI-compatible
endpoint); `orchestrator` parses a workflow (`conductor_pipeline.workflow`), runs its steps against
the pool, grades the final answer and records every call. Used by training rollouts and eval arms.
"""
