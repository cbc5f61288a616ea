"""pytest hooks of pytest-kernelpro (hooks only; the work lives in the parts)."""

from __future__ import annotations
