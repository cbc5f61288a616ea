"""Candidate builds and evaluations as tasks on a Dask cluster."""
