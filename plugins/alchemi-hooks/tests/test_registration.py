"""alchemi-hooks loads as a plugin; each hook is a component and a public name."""

from __future__ import annotations

import importlib

import pytest

from alchemi_core import registry
from alchemi_core.dynamics import DynamicsStage, Hook
from alchemi_hooks.plugin import HOOKS


def test_plugin_loads_ok():
    records = {r.name: r for r in registry.plugins()}
    assert records["hooks"].status == "ok", records["hooks"].error


def test_registers_what_core_names_as_first_party():
    promised = {n for n in registry.FIRST_PARTY["alchemi-hooks"] if n.startswith("hook:")}
    assert promised == {f"hook:{name}" for name, _, _ in HOOKS}


@pytest.mark.parametrize(("name", "target", "summary"), HOOKS)
def test_each_hook_resolves_and_imports_from_alchemi_core(name, target, summary):
    cls = registry.resolve(f"hook:{name}")
    module, attr = target.split(":")
    assert cls is getattr(importlib.import_module(module), attr)
    public = importlib.import_module("alchemi_core.dynamics.hooks")
    assert getattr(public, attr) is cls
    assert issubclass(cls, Hook) and isinstance(cls.stage, DynamicsStage)
    assert summary


def test_build_makes_a_configured_hook():
    hook = registry.build("hook:max-force-clamp", max_force=3.0)
    assert hook.max_force == 3.0
