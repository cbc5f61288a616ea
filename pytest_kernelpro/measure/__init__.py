"""measure part of pytest-kernelpro."""
