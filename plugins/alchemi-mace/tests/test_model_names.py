"""MACE foundation models by name: found in ``$ALCHEMI_MODEL_DIR`` or mace-torch's cache; a
missing one is one error that says which file to place where (or ``download=True``), and a
download that fails (no network) says so, not a raw ``URLError``."""

from __future__ import annotations

import json
import os
import shutil
from urllib.error import URLError

import pytest
import torch

from alchemi_core.data import Batch
from alchemi_core.errors import ModelNotAvailableError

SMALL_FILE = "2023-12-10-mace-128-L0_energy_epoch-249.model"  # the file MACE-MP-0 small's URL ends in


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """An empty cache (XDG_CACHE_HOME), no model directory, and a loader that cannot download."""
    from mace.calculators import foundations_models

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("ALCHEMI_MODEL_DIR", raising=False)
    calls = []

    def no_network(model=None):
        calls.append(model)
        raise URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(foundations_models, "download_mace_mp_checkpoint", no_network)
    return calls


def test_every_published_foundation_model_has_a_name():
    from alchemi_mace.names import FOUNDATION_NAMES
    from mace.calculators import foundations_models as fm

    assert {k for f, k in FOUNDATION_NAMES.values() if f == "mp"} == set(fm.mace_mp_urls)
    assert {k for f, k in FOUNDATION_NAMES.values() if f == "off"} == set(fm.mace_off_urls)
    assert FOUNDATION_NAMES["mace-mp-0-small"] == ("mp", "small")


def test_a_missing_name_says_which_file_to_place_where_and_downloads_nothing(offline, tmp_path):
    from alchemi_mace import MaceModel

    with pytest.raises(ModelNotAvailableError) as err:
        MaceModel(model_path="mace-mp-0-small", trust_model_file=True)
    message = str(err.value)
    assert "'mace-mp-0-small' is not on this machine" in message
    assert f"place {SMALL_FILE} (from https://" in message
    assert str(tmp_path / "cache" / "mace") in message and "ALCHEMI_MODEL_DIR" in message
    assert "download=True" in message
    assert offline == []  # nothing was fetched


def test_a_download_that_fails_is_reported_with_where_to_place_the_file(offline, monkeypatch, tmp_path):
    from alchemi_mace import MaceModel

    monkeypatch.setenv("ALCHEMI_MODEL_DIR", str(tmp_path / "models"))
    with pytest.raises(ModelNotAvailableError) as err:
        MaceModel(model_path="mace-mpa-0-medium", trust_model_file=True, download=True)
    message = str(err.value)
    assert offline == ["medium-mpa-0"]  # mace-torch's own loader was asked
    assert "model:mace: could not download 'mace-mpa-0-medium' (URLError:" in message
    assert f"in {tmp_path / 'models'} ($ALCHEMI_MODEL_DIR)" in message


def test_mace_off_is_never_downloaded_by_alchemi(offline):
    from alchemi_mace import MaceModel

    with pytest.raises(ModelNotAvailableError, match="MACE-OFF23_small.model"):
        MaceModel(model_path="mace-off23-small", trust_model_file=True, download=True)
    assert offline == []


@pytest.mark.parametrize("where", ["model_dir", "mace_cache"])
def test_a_name_resolves_from_a_local_directory(offline, monkeypatch, tmp_path, mp_small_file, where):
    from alchemi_mace import MaceModel

    if where == "model_dir":
        monkeypatch.setenv("ALCHEMI_MODEL_DIR", str(tmp_path / "models"))
        target = tmp_path / "models" / SMALL_FILE
    else:  # where mace_mp keeps its download: the URL's name, letters, digits and _ only
        target = tmp_path / "cache" / "mace" / "20231210mace128L0_energy_epoch249model"
    target.parent.mkdir(parents=True)
    shutil.copy(mp_small_file, target)
    by_name = MaceModel(model_path="mace-mp-0-small", trust_model_file=True)
    by_path = MaceModel(model_path=os.fspath(mp_small_file), trust_model_file=True)
    from ase.build import bulk

    batch = Batch.from_atoms([bulk("Cu", "fcc", a=3.6, cubic=True)], dtype=torch.float64)
    torch.testing.assert_close(by_name(batch)["energy"], by_path(batch)["energy"])
    assert offline == []


def test_a_path_is_still_a_path(mp_small_file):
    from alchemi_mace.names import model_file

    assert model_file(mp_small_file) == mp_small_file
    assert model_file("no/such/file.model") == "no/such/file.model"  # load_model_file names it


def test_list_components_models_shows_each_name_and_whether_its_file_is_here(offline, monkeypatch, tmp_path):
    from alchemi_mace.names import FOUNDATION_NAMES
    from click.testing import CliRunner

    from alchemi_core.cli import main

    runner = CliRunner()
    listed = json.loads(runner.invoke(main, ["list-components", "--models", "--json"]).output)
    mace = {m["name"]: m for m in listed["models"] if m["component"] == "model:mace"}
    assert set(mace) == set(FOUNDATION_NAMES)
    assert mace["mace-mp-0-small"] == {"component": "model:mace", "name": "mace-mp-0-small", "file": SMALL_FILE,
                                       "path": None}
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / SMALL_FILE).write_bytes(b"x")
    monkeypatch.setenv("ALCHEMI_MODEL_DIR", str(tmp_path / "models"))
    table = runner.invoke(main, ["list-components", "--models"]).output
    small = next(line for line in table.splitlines() if " mace-mp-0-small " in line)
    assert str(tmp_path / "models" / SMALL_FILE) in small
    medium = next(line for line in table.splitlines() if " mace-mp-0-medium " in line)
    assert "missing: place 2023-12-03-mace-128-L1_epoch-199.model in $ALCHEMI_MODEL_DIR" in medium
    assert offline == []  # listing never downloads
