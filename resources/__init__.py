"""Dagster resources: thin, typed wrappers that build `conductor_pipeline` objects from configuration."""
