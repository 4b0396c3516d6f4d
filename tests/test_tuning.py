"""Each plugin's frozen Tuning: the measured per-device choices, passed to the components that use
them (``alchemi_core.tuning``)."""

from __future__ import annotations

import attrs
import pytest
import torch

from alchemi_core.errors import ConfigurationError
from alchemi_core.tuning import CoreTuning, evolve_from_text


def test_each_device_gets_its_measured_choices() -> None:
    assert CoreTuning.for_device("cuda") == CoreTuning(run_ahead=True, masks_in_step=True, force_max_kernel=True)
    assert CoreTuning.for_device(torch.device("cuda", 1)) == CoreTuning.for_device("cuda:0")
    assert CoreTuning.for_device("cpu") == CoreTuning(run_ahead=False, masks_in_step=False, force_max_kernel=True)
    assert not CoreTuning.for_device("meta").force_max_kernel  # no measurements: torch's paths
    with pytest.raises(ConfigurationError, match="torch device"):
        CoreTuning.for_device("gpu")
    with pytest.raises(ConfigurationError, match="str or torch.device"):
        CoreTuning.for_device(0)  # type: ignore[arg-type]


def test_a_tuning_is_frozen_and_changed_by_evolve() -> None:
    tuning = CoreTuning.for_device("cpu")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        tuning.run_ahead = True  # type: ignore[misc]
    assert attrs.evolve(tuning, run_ahead=True).run_ahead and not tuning.run_ahead


def test_settings_from_text_name_the_fields_they_may_set() -> None:
    cpu = CoreTuning.for_device("cpu")
    assert evolve_from_text(cpu, "") == cpu
    assert evolve_from_text(cpu, " run_ahead = True ,masks_in_step=True") == attrs.evolve(
        cpu, run_ahead=True, masks_in_step=True)
    for bad, match in [("skin=0.5", "run_ahead, masks_in_step, force_max_kernel"), ("run_ahead", "name=value"),
                       ("run_ahead=yes", "Python literal")]:
        with pytest.raises(ConfigurationError, match=match):
            evolve_from_text(cpu, bad)


def test_components_refuse_another_plugins_tuning() -> None:
    pytest.importorskip("alchemi_potentials")
    from alchemi_integrators import FIRE
    from alchemi_potentials import BatchedNeighborList, LennardJones
    from alchemi_potentials.tuning import PotentialsTuning

    model = LennardJones(0.0104, 3.405, 8.5, tuning=PotentialsTuning.for_device("cpu"))
    assert model.neighbor_list.tuning == PotentialsTuning.for_device("cpu")  # the model's own list takes it
    with pytest.raises(ConfigurationError, match="FIRE tuning must be a CoreTuning"):
        FIRE(model, tuning=PotentialsTuning.for_device("cpu"))
    with pytest.raises(ConfigurationError, match="lennard-jones tuning must be a PotentialsTuning"):
        LennardJones(0.0104, 3.405, 8.5, tuning=CoreTuning.for_device("cpu"))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="BatchedNeighborList tuning must be a PotentialsTuning"):
        BatchedNeighborList(8.5, tuning="cuda")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="unroll"):
        evolve_from_text(PotentialsTuning.for_device("cuda"), "unroll=3")


def test_a_fused_stage_takes_its_first_sub_stages_tuning() -> None:
    pytest.importorskip("alchemi_potentials")
    from alchemi_core.dynamics import FusedStage
    from alchemi_integrators import FIRE, VelocityVerlet
    from alchemi_potentials import LennardJones

    model = LennardJones(0.0104, 3.405, 8.5)
    tuned = attrs.evolve(CoreTuning.for_device("cpu"), run_ahead=True)
    fused = FIRE(model) + VelocityVerlet(model, tuning=tuned)
    assert isinstance(fused, FusedStage) and fused.tuning == tuned
    assert FusedStage([(0, FIRE(model))]).tuning is None  # the batch's device's, at the run
    own = CoreTuning.for_device("cuda")
    assert FusedStage([(0, VelocityVerlet(model, tuning=tuned))], tuning=own).tuning == own


def test_the_zarr_sink_hands_its_tuning_to_each_snapshot(tmp_path, monkeypatch) -> None:
    pytest.importorskip("alchemi_zarr")
    from alchemi_core.testing import make_batch
    from alchemi_zarr import ZarrData, pending
    from alchemi_zarr.tuning import ZarrTuning

    assert ZarrTuning.for_device("cuda").copy_stream and not ZarrTuning.for_device("cpu").copy_stream
    seen = []
    real = pending.snapshot

    def spy(*args, **kwargs):
        seen.append(kwargs.get("tuning"))
        return real(*args, **kwargs)

    monkeypatch.setattr(pending, "snapshot", spy)
    tuning = ZarrTuning(copy_stream=False)
    sink = ZarrData(str(tmp_path / "t.zarr"), asynchronous="thread", tuning=tuning)
    sink.write(make_batch([3, 2]))
    sink.close()
    assert seen == [tuning]
    with pytest.raises(ConfigurationError, match="ZarrData tuning must be a ZarrTuning"):
        ZarrData(str(tmp_path / "u.zarr"), tuning=CoreTuning.for_device("cpu"))  # type: ignore[arg-type]


def test_the_tuning_fixture_follows_the_option(request, core_tuning) -> None:
    """``--tuning=cuda`` gives a GPU's choices to the tests that take the fixture, on any device."""
    if request.config.getoption("--tuning") == "cuda":
        assert core_tuning == CoreTuning.for_device("cuda")
    else:
        assert core_tuning is None
