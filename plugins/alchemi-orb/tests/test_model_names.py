"""ORB models by name: found in ``$ALCHEMI_MODEL_DIR`` or cached-path's cache (where orb-models
keeps its downloads); a missing one is one error that says which file to place where (or
``download=True``), and a download that fails (no network) says so."""

from __future__ import annotations

import json
import os

import pytest
import torch

from alchemi_core.data import Batch
from alchemi_core.errors import ModelNotAvailableError

NAME = "orb-v3-conservative-inf-omat"
FILE = "orb-v3-conservative-inf-omat-20250404.ckpt"  # the file its URL ends in


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """An empty cached-path cache, no model directory, and a cached_path that cannot download."""
    import cached_path
    import requests
    from cached_path import common

    monkeypatch.setattr(common, "CACHE_DIRECTORY", tmp_path / "cache")
    monkeypatch.delenv("ALCHEMI_MODEL_DIR", raising=False)
    calls = []

    def no_network(url, *args, **kwargs):
        calls.append(url)
        raise requests.exceptions.ConnectionError(f"Failed to resolve {url}")

    monkeypatch.setattr(cached_path, "cached_path", no_network)
    return calls


def test_every_published_model_with_weights_has_a_name():
    from alchemi_orb.names import model_names
    from orb_models.forcefield.pretrained import ORB_PRETRAINED_MODELS

    names = model_names()
    assert set(names) <= set(ORB_PRETRAINED_MODELS)
    assert {n for n in ORB_PRETRAINED_MODELS if n not in names} == {n for n in ORB_PRETRAINED_MODELS if "v1" in n
                                                                    and not n.startswith("orbmol")}
    assert os.path.basename(names[NAME]) == FILE


def test_a_missing_name_says_which_file_to_place_where_and_downloads_nothing(offline, tmp_path):
    from alchemi_orb import OrbModel

    with pytest.raises(ModelNotAvailableError) as err:
        OrbModel(NAME)
    message = str(err.value)
    assert f"model:orb: {NAME!r} is not on this machine" in message
    assert f"place {FILE} (from https://" in message and str(tmp_path / "cache") in message
    assert "ALCHEMI_MODEL_DIR" in message and "download=True" in message
    assert offline == []


def test_a_download_that_fails_is_reported_with_where_to_place_the_file(offline, monkeypatch, tmp_path):
    from alchemi_orb import OrbModel

    monkeypatch.setenv("ALCHEMI_MODEL_DIR", str(tmp_path / "models"))
    with pytest.raises(ModelNotAvailableError) as err:
        OrbModel("orb-v3-direct-20-omat", download=True)
    message = str(err.value)
    assert len(offline) == 1 and offline[0].endswith("orb-v3-direct-20-omat-20250404.ckpt")
    assert "model:orb: could not download 'orb-v3-direct-20-omat' (ConnectionError:" in message
    assert f"in {tmp_path / 'models'} ($ALCHEMI_MODEL_DIR)" in message


def test_a_name_resolves_from_cached_paths_cache(offline, tmp_path):
    from alchemi_orb.names import model_names, weights_file
    from cached_path import resource_to_filename

    cached = tmp_path / "cache" / resource_to_filename(model_names()[NAME])
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"weights")
    assert weights_file(NAME) == str(cached)


def test_a_name_resolves_from_the_model_directory_and_loads_its_architecture(offline, monkeypatch, tmp_path):
    """Random weights of the published architecture under the published file name: model:orb
    loads them with orb-models' loader of that name and gives what ORB's calculator gives."""
    from alchemi_orb import OrbModel
    from orb_models.forcefield import pretrained
    from orb_models.forcefield.inference.calculator import ORBCalculator

    models = tmp_path / "models"
    models.mkdir()
    torch.manual_seed(0)
    torch.save(pretrained.orb_v3_conservative_architecture(device="cpu").state_dict(), models / FILE)
    monkeypatch.setenv("ALCHEMI_MODEL_DIR", str(models))
    by_name = OrbModel(NAME)
    by_path = OrbModel(models / FILE, architecture=NAME)
    assert (by_name.radius, by_name.max_num_neighbors, by_name.conservative) == (6.0, 120, True)
    # what orb-models' loader of this name sets after loading (its older orb-v3 weights' ZBL)
    assert by_name.network.pair_repulsion_fn.node_aggregation == "mean"
    network, adapter = pretrained.orb_v3_conservative_inf_omat(weights_path=str(models / FILE), device="cpu",
                                                              precision="float32-highest", compile=False)
    from alchemi_orb.testing import mixed_structures

    methane = mixed_structures()[2]  # few edges: the full-size network stays quick on a CPU
    methane.calc = ORBCalculator(network, adapter, device="cpu")
    batch = Batch.from_atoms([methane], dtype=torch.float32)
    for model in (by_name, by_path):
        out = model(batch)
        assert abs(out["energy"].item() - methane.get_potential_energy()) < 1e-4
        torch.testing.assert_close(out["forces"], torch.tensor(methane.get_forces(), dtype=torch.float32),
                                   rtol=0, atol=1e-5)
    assert offline == []


def test_list_components_models_shows_every_name_and_the_placed_file(offline, monkeypatch, tmp_path):
    from click.testing import CliRunner

    from alchemi_core.cli import main

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / FILE).write_bytes(b"x")
    monkeypatch.setenv("ALCHEMI_MODEL_DIR", str(tmp_path / "models"))
    listed = json.loads(CliRunner().invoke(main, ["list-components", "--models", "--json"]).output)
    orb = {m["name"]: (m["file"], m["path"]) for m in listed["models"] if m["component"] == "model:orb"}
    assert orb[NAME] == (FILE, str(tmp_path / "models" / FILE))
    assert orb["orb-v3-direct-20-omat"] == ("orb-v3-direct-20-omat-20250404.ckpt", None)
    assert {"orb-v3-conservative-20-omat", "orb-v3-direct-inf-mpa", "orb-v2", "orbmol-v2"} <= set(orb)
