"""search part of pytest-kernelpro."""
