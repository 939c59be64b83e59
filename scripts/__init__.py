"""One-off tools of the project (pool generation, tuning, experiments, the GPU smoke run); each runs
as a module from the repository root (`python -m scripts.<name>`)."""
