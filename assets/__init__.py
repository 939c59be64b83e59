"""Dagster software-defined assets, checks, jobs and schedules, one module per stage.

`assets.definitions` builds the single Definitions object that `workspace.yaml` loads.

Importing the package first holds the float libraries to AVX2 kernels (before numpy or torch is
loaded by `python -m assets.main` and the other entry points), so that machines with and without
AVX-512 compute the same figures (`conductor_pipeline.reproducibility.hold_vector_kernels`).
"""

from conductor_pipeline.reproducibility import hold_vector_kernels

hold_vector_kernels()
