"""Pools: which workers a run may call, and how every call is made, paced and classified.

`config` validates the pool files (data/pools/*.yaml); `governor` decides when each call may go
(concurrency per pool and seat, rate limits); `backends` answer calls (OpenAI-compatible HTTP,
vLLM, replay of recorded answers). Feeds the `probe_calls` asset and every workflow step.
"""
