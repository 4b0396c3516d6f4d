"""AIMNet2 models by name: found in ``$ALCHEMI_MODEL_DIR`` or aimnet's cache; a missing one is one
error that says which file to place where (or ``download=True``), and a download that fails (no
network) says so, not a raw ``ConnectionError``."""

from __future__ import annotations

import shutil

import pytest
import torch

from alchemi_core.data import Batch
from alchemi_core.errors import ConfigurationError, ModelNotAvailableError

#: The file aimnet downloads for the name "aimnet2" (registry key aimnet2-wb97m-d3_0).
AIMNET2_FILE = "aimnet2_wb97m_d3_0.pt"


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """An empty aimnet cache, no model directory, and a registry download that cannot reach the network."""
    import requests
    from aimnet.calculators import model_registry

    monkeypatch.setenv("AIMNET_CACHE_DIR", str(tmp_path / "aimnet-cache"))
    monkeypatch.delenv("ALCHEMI_MODEL_DIR", raising=False)
    calls = []

    def no_network(filename, url, expected_sha256):
        calls.append(url)
        raise requests.exceptions.ConnectionError(f"Failed to resolve {url}")

    monkeypatch.setattr(model_registry, "_download_asset_atomic", no_network)
    return calls


def test_a_missing_name_says_which_file_to_place_where_and_downloads_nothing(offline, tmp_path):
    from alchemi_aimnet import AIMNet2Model

    with pytest.raises(ModelNotAvailableError) as err:
        AIMNet2Model("aimnet2")
    message = str(err.value)
    assert "model:aimnet2: 'aimnet2' is not on this machine" in message
    assert f"place {AIMNET2_FILE} (from https://" in message
    assert str(tmp_path / "aimnet-cache" / AIMNET2_FILE) in message and "ALCHEMI_MODEL_DIR" in message
    assert "download=True" in message
    assert offline == []


def test_a_download_that_fails_is_reported_with_where_to_place_the_file(offline, monkeypatch, tmp_path):
    from alchemi_aimnet import AIMNet2Model

    monkeypatch.setenv("ALCHEMI_MODEL_DIR", str(tmp_path / "models"))
    with pytest.raises(ModelNotAvailableError) as err:
        AIMNet2Model("aimnet2", download=True)
    message = str(err.value)
    assert "model:aimnet2: could not download 'aimnet2' (ConnectionError" in message
    assert f"place {AIMNET2_FILE} (from https://" in message and f"in {tmp_path / 'models'} ($ALCHEMI_MODEL_DIR)" in message
    assert len(offline) == 1  # aimnet was asked, once


def test_a_name_resolves_from_the_prepared_model_directory(offline, monkeypatch, tmp_path, model_path, molecules):
    """The random network under the name's file: the name finds it, and gives its results."""
    from alchemi_aimnet import AIMNet2Model
    from alchemi_aimnet.model import model_file

    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(model_path, models / AIMNET2_FILE)
    monkeypatch.setenv("ALCHEMI_MODEL_DIR", str(models))
    assert model_file("aimnet2") == (str(models / AIMNET2_FILE), "wb97m-d3")
    assert model_file("aimnet2-wb97m-d3_0")[0] == str(models / AIMNET2_FILE)
    by_name, by_path = AIMNet2Model("aimnet2"), AIMNet2Model(model_path)
    batch = Batch.from_atoms(molecules[:2], dtype=torch.float32)
    torch.testing.assert_close(by_name(batch)["energy"], by_path(batch)["energy"], rtol=0, atol=0)
    assert offline == []


def test_a_name_resolves_from_aimnets_cache(offline, tmp_path, model_path):
    from alchemi_aimnet.model import model_file

    (tmp_path / "aimnet-cache").mkdir()
    shutil.copy(model_path, tmp_path / "aimnet-cache" / AIMNET2_FILE)
    assert model_file("aimnet2")[0] == str(tmp_path / "aimnet-cache" / AIMNET2_FILE)


def test_torchscript_files_need_trust(tmp_path):
    from alchemi_aimnet import AIMNet2Model

    script = tmp_path / "legacy.jpt"
    script.write_bytes(b"not really torchscript")
    with pytest.raises(ConfigurationError, match="TorchScript, which runs code from the file; pass trust_model_file"):
        AIMNet2Model(str(script))
    with pytest.raises(ConfigurationError, match="is not an aimnet model file"):
        AIMNet2Model(str(script), trust_model_file=True)
