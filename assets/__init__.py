"""Dagster software-defined assets, checks, jobs and schedules, one module per stage.

`assets.definitions` builds the single Definitions object that `workspace.yaml` loads.
"""
