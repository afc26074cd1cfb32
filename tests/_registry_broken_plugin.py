"""Test-only: a third-party plugin module that fails on import (tests/test_registry.py)."""
raise RuntimeError("this plugin is broken")
