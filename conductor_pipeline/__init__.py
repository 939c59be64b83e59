"""Coryphaeus: the domain library of the conductor pipeline.

Pure Python, no Dagster import: everything here can be reused from a notebook, a
script or another orchestrator. `resources/` wraps it, `assets/` wires it.
"""
