"""cutlass part of pytest-kernelpro."""
