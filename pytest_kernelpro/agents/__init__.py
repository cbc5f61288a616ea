"""agents part of pytest-kernelpro."""
