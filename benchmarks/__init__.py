"""Benchmarks and measurements of the pipeline; each runs as a module from the repository root
(`python -m benchmarks.<name>`) and records its figures in benchmarks/RESULTS-*.md."""
