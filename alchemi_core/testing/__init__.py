"""Test helpers for alchemi and its plugins: fixtures, fake plugins and contract test classes.

Plugins reuse these so every sink, integrator and comm backend is held to the same contract::

    from alchemi_core.testing.contracts import SinkContract

    class TestMySink(SinkContract):
        def make_sink(self, capacity):
            return MySink(capacity=capacity)

Fixtures (``isolated_registry``, ``fake_plugins_path``) become available with
``pytest_plugins = ["alchemi_core.testing.fixtures"]`` in a ``conftest.py``.
"""

from __future__ import annotations

from alchemi_core.testing.factories import (
    make_batch,
    make_structure,
    never_converging,
    random_structures,
    rattled_argon,
)
from alchemi_core.testing.plugins import FAKE_DISTS, temporary_plugin

__all__ = [
    "FAKE_DISTS", "make_batch", "make_structure", "never_converging", "random_structures", "rattled_argon",
    "temporary_plugin",
]
