"""tools part of pytest-kernelpro."""
