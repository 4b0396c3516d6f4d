"""Every hook of this package passes alchemi_core's HookContract (one class per hook, and a test
that no registered hook lacks one)."""

from __future__ import annotations

import io

from alchemi_core import registry
from alchemi_core.dynamics import HostMemory
from alchemi_core.testing.hook_contract import HookContract
from alchemi_hooks.plugin import HOOKS


class TestMaxForceClamp(HookContract):
    name = "max-force-clamp"

    def make_hook(self):
        return registry.build("hook:max-force-clamp", max_force=0.05)


class TestLogging(HookContract):
    name = "logging"

    def make_hook(self):
        return registry.build("hook:logging", backend="csv", log_path=self.tmp_path / "log.csv", frequency=3)


class TestSnapshot(HookContract):
    name = "snapshot"

    def make_hook(self):
        return registry.build("hook:snapshot", sink=HostMemory(capacity=None), frequency=4)


class TestConvergedSnapshot(HookContract):
    name = "converged-snapshot"

    def make_hook(self):
        return registry.build("hook:converged-snapshot", sink=HostMemory(capacity=None))


class TestNaNDetector(HookContract):
    name = "nan-detector"

    def make_hook(self):
        return registry.build("hook:nan-detector", frequency=2)


class TestEnergyDrift(HookContract):
    name = "energy-drift"

    def make_hook(self):
        return registry.build("hook:energy-drift", threshold=10.0, frequency=3)


class TestFreezeAtoms(HookContract):
    name = "freeze-atoms"

    def make_hook(self):
        # Atoms 3 and 4 are the first two of the second system (sizes [3, 4, ...]), which the
        # hook's own stage runs in the other-stages test.
        return registry.build("hook:freeze-atoms", indices=[3, 4])


class TestWrapPeriodic(HookContract):
    name = "wrap-periodic"

    def make_hook(self):
        return registry.build("hook:wrap-periodic")


class TestProgress(HookContract):
    name = "progress"

    def make_hook(self):
        return registry.build("hook:progress", frequency=5, backend="plain", file=io.StringIO())


class TestStageTiming(HookContract):
    name = "stage-timing"

    def make_hook(self):
        return registry.build("hook:stage-timing", report=False)


def test_every_registered_hook_has_a_contract_class():
    covered = {cls.name for cls in HookContract.__subclasses__() if cls.__module__ == __name__}
    assert covered == {name for name, _, _ in HOOKS}
