"""profile part of pytest-kernelpro."""
