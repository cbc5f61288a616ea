"""pytest-kernelpro: a pytest plugin and CI regression gate for GPU kernels."""

from __future__ import annotations

__version__ = "0.1.0"
