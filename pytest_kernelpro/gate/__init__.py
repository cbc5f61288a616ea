"""gate part of pytest-kernelpro."""
