"""Worker backends: every way a pool seat can answer a call (openai-compatible HTTP, vLLM, replay)."""

from conductor_pipeline.pools.backends.base import RecordedWorker, Worker

__all__ = ["RecordedWorker", "Worker"]
