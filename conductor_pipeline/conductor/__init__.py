"""The conductor: its prompt, the policies that write workflows, and the orchestrator that runs them.

`prompt` builds the conductor's chat messages (format rules, worker catalogue, examples);
`protocols` says what a policy is (it turns a prompt into workflow text); `hf_policy` is a local
Hugging Face model, `endpoint_policy` an OpenAI-compatible endpoint (where a local model runs:
`conductor_pipeline.devices`); `generation` samples with each shared prompt prefix computed once;
`orchestrator` parses a workflow (`conductor_pipeline.workflow`), runs its steps against
the pool, grades the final answer and records every call. Used by training rollouts and eval arms.
"""
