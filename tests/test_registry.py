"""Plugin discovery and the registry: statuses, isolation, and the errors users see."""

from __future__ import annotations

import importlib.metadata as md
import sys
import types

import pytest

from alchemi_core import registry
from alchemi_core.errors import (
    ComponentConflictError,
    ComponentNotFoundError,
    MissingDependencyError,
    PluginLoadError,
)
from alchemi_core.plugin import hookimpl
from alchemi_core.plugin.manager import PluginManager
from alchemi_core.testing import temporary_plugin


def _fake_eps(path: str) -> list[md.EntryPoint]:
    dists = md.distributions(path=[path])
    return [ep for d in dists for ep in d.entry_points if ep.group == "alchemi.plugins"]


def test_builtins_register_through_the_hooks(isolated_registry):
    assert isolated_registry.record("alchemi-core").status == "ok"
    specs = {r.spec for r in registry.available()}
    assert {"model:demo", "integrator:demo", "sink:host-memory", "comm:inprocess"} <= specs


def test_fake_distributions_are_discovered_each_on_its_own(fake_plugins_path):
    pm = PluginManager.discover(entry_points=_fake_eps(fake_plugins_path), strict=False)
    assert pm.record("fake-good").status == "ok"
    assert pm.record("fake-good").version == "1.0"
    assert pm.record("fake-good").distribution == "alchemi-fake-good"
    assert sorted(pm.record("fake-good").provides) == ["integrator:fake-good", "model:fake-good"]
    broken = pm.record("fake-broken")
    assert broken.status == "failed"
    assert "not_installed_anywhere" in broken.error and "ImportError" in broken.error
    assert "Traceback" in broken.traceback
    unknown = pm.record("fake-unknown-hook")
    assert unknown.status == "failed"
    assert "alchemi_regster_models" in unknown.error and "alchemi_register_models" in unknown.error
    # The bad plugins registered nothing.
    assert "model:never" not in pm.components


def test_strict_mode_raises_naming_the_plugin(fake_plugins_path):
    with pytest.raises(PluginLoadError, match="fake-broken"):
        PluginManager.discover(entry_points=_fake_eps(fake_plugins_path), strict=True)


def test_strict_from_environment(fake_plugins_path, monkeypatch):
    monkeypatch.setenv("ALCHEMI_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError):
        PluginManager.discover(entry_points=_fake_eps(fake_plugins_path))


def test_disabled_plugins_are_not_imported(fake_plugins_path, monkeypatch):
    monkeypatch.setenv("ALCHEMI_DISABLE_PLUGINS", "fake-broken, alchemi-fake-good,fake-unknown-hook")
    pm = PluginManager.discover(entry_points=_fake_eps(fake_plugins_path), strict=True)
    assert pm.record("fake-broken").status == "disabled"
    assert pm.record("fake-good").status == "disabled"
    assert "alchemi_fake_good" not in sys.modules
    assert "model:fake-good" not in pm.components


def test_misspelt_name_suggests_and_lists(isolated_registry):
    with pytest.raises(ComponentNotFoundError) as err:
        registry.resolve("model:demo-modle")
    msg = str(err.value)
    assert "Did you mean 'model:demo'?" in msg
    assert "Available model components: demo" in msg


def test_unknown_kind_is_named(isolated_registry):
    with pytest.raises(ComponentNotFoundError, match="Unknown kind 'modle'.*did you mean 'model'"):
        registry.resolve("modle:demo")


def test_malformed_spec():
    with pytest.raises(ComponentNotFoundError, match="kind:name"):
        registry.resolve("demo")


def test_two_plugins_one_name_names_both():
    class Second:
        @staticmethod
        @hookimpl
        def alchemi_register_models(registrar):
            registrar.add("demo", "alchemi_core.models.demo:DemoModelWrapper")

    with temporary_plugin(Second, name="second-demo"):
        with pytest.raises(ComponentConflictError) as err:
            registry.resolve("model:demo")
    assert "alchemi-core" in str(err.value) and "second-demo" in str(err.value)


def test_component_of_a_failed_plugin_shows_its_error(fake_plugins_path):
    pm = PluginManager.discover(entry_points=_fake_eps(fake_plugins_path), strict=False)
    old = registry.use_manager(pm)
    try:
        with pytest.raises(ComponentNotFoundError, match="fake-broken.*not_installed_anywhere"):
            registry.resolve("model:fake-broken")
        # A first-party plugin that failed: its error is the message.
        pm.records["potentials"] = type(pm.record("fake-broken"))(
            name="potentials", distribution="alchemi-potentials", version="0", status="failed",
            error="ImportError: warp missing",
        )
        with pytest.raises(PluginLoadError, match="alchemi-potentials.*warp missing"):
            registry.resolve("model:lennard-jones")
    finally:
        registry.use_manager(old)


def test_missing_first_party_plugin_says_what_to_install(isolated_registry):
    with pytest.raises(ComponentNotFoundError, match="pip install alchemi-potentials"):
        registry.resolve("model:lennard-jones")


def test_missing_optional_dependency_says_what_to_install(tmp_path, monkeypatch):
    class NeedsPackage:
        @staticmethod
        @hookimpl
        def alchemi_register_models(registrar):
            registrar.add("needs-pkg", "alchemi_fake_target_module:Model",
                          requires={"some_missing_pkg_xyz": "alchemi-fake[extra]"})

    (tmp_path / "alchemi_fake_target_module.py").write_text("import some_missing_pkg_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "alchemi_fake_target_module", raising=False)
    with temporary_plugin(NeedsPackage, name="needs"):
        with pytest.raises(MissingDependencyError, match=r"pip install alchemi-fake\[extra\]"):
            registry.resolve("model:needs-pkg")


def test_build_makes_an_instance(isolated_registry):
    sink = registry.build("sink:host-memory", capacity=7)
    assert sink.capacity == 7 and len(sink) == 0


def test_registration_hook_that_raises_fails_only_that_plugin():
    class Raises:
        @staticmethod
        @hookimpl
        def alchemi_register_hooks(registrar):
            raise RuntimeError("boom while registering")

    pm = PluginManager.discover(entry_points=False)
    module = types.ModuleType("raises")
    module.alchemi_register_hooks = Raises.alchemi_register_hooks
    pm._load_module("raises", module, "raises", "0", "", False, strict=False)
    assert pm.record("raises").status == "failed"
    assert "boom while registering" in pm.record("raises").error
    assert pm.record("alchemi-core").status == "ok"


def test_bad_registration_is_rejected_with_the_rule():
    class BadName:
        @staticmethod
        @hookimpl
        def alchemi_register_models(registrar):
            registrar.add("Bad Name", "x.y:Z")

    pm = PluginManager.discover(entry_points=False)
    module = types.ModuleType("badname")
    module.alchemi_register_models = BadName.alchemi_register_models
    pm._load_module("badname", module, "badname", "0", "", False, strict=False)
    assert "lower-case" in pm.record("badname").error


def test_exported_names_resolve_through_the_registry():
    class Exports:
        @staticmethod
        @hookimpl
        def alchemi_register_sinks(registrar):
            registrar.add("gpu-buffer", "alchemi_core.dynamics.sinks:HostMemory",
                          exports=["alchemi_core.dynamics.GPUBuffer"])

    with temporary_plugin(Exports, name="exporter"):
        from alchemi_core.dynamics import GPUBuffer
        from alchemi_core.dynamics.sinks import HostMemory

        assert GPUBuffer is HostMemory


def test_export_without_plugin_names_the_distribution(isolated_registry):
    with pytest.raises(ImportError, match="pip install alchemi-warp"):
        from alchemi_core.dynamics import GPUBuffer  # noqa: F401
    with pytest.raises(ImportError, match="pip install alchemi-hooks"):
        from alchemi_core.dynamics.hooks import MaxForceClampHook  # noqa: F401
    with pytest.raises(AttributeError):
        import alchemi_core.dynamics as dyn

        dyn.NotAThing  # noqa: B018


def test_lifecycle_hooks_run_once_per_run():
    import torch

    from alchemi_core.data import AtomicData, Batch
    from alchemi_core.dynamics import DemoDynamics
    from alchemi_core.models.demo import DemoModelWrapper

    calls: list[str] = []

    class Lifecycle:
        @staticmethod
        @hookimpl
        def alchemi_run_start(run):
            calls.append("start")

        @staticmethod
        @hookimpl
        def alchemi_run_end(run, result):
            calls.append("end")

        @staticmethod
        @hookimpl
        def alchemi_run_error(run, error):
            calls.append(f"error:{type(error).__name__}")

    batch = Batch.from_data_list([AtomicData(atomic_numbers=torch.tensor([1, 1]), positions=torch.rand(2, 3))])
    with temporary_plugin(Lifecycle, name="lifecycle"):
        DemoDynamics(model=DemoModelWrapper(), n_steps=25, dt=0.5).run(batch)
        assert calls == ["start", "end"]

        def bad_model(b):
            raise ValueError("model exploded")

        with pytest.raises(ValueError):
            DemoDynamics(model=bad_model, n_steps=5, dt=0.5).run(batch)
    assert calls == ["start", "end", "error:ValueError"]
