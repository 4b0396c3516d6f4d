"""alchemi-template passes the integrator contract and is found by name."""

from __future__ import annotations

from alchemi_core import registry
from alchemi_core.testing.contracts import IntegratorContract

from alchemi_template.integrator import SymplecticEuler


class TestSymplecticEuler(IntegratorContract):
    def make_integrator(self, model, n_steps, **kwargs):
        return SymplecticEuler(model=model, n_steps=n_steps, dt=0.5, **kwargs)


def test_registered_by_name():
    assert registry.resolve("integrator:template-euler") is SymplecticEuler
