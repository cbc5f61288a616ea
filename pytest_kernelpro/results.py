"""The record's old home, kept so `from pytest_kernelpro.results import KernelRecord` (user
conftests, the `pytest_kernelpro_record` hook's callers) keeps working: see `record/`."""

from pytest_kernelpro.record import RECORD_PROPERTY, SCHEMA_VERSION, KernelRecord

__all__ = ["RECORD_PROPERTY", "SCHEMA_VERSION", "KernelRecord"]
