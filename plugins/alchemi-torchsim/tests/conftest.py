"""Fixtures of alchemi_core's test suite; models come from alchemi_torchsim.testing."""

from __future__ import annotations

import mace  # noqa: F401 - before anything imports e3nn (mace-torch pins e3nn 0.4.4)

pytest_plugins = ["alchemi_core.testing.fixtures"]
