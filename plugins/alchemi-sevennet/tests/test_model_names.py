"""SevenNet checkpoints by name: found in ``$ALCHEMI_MODEL_DIR`` or where sevenn keeps them; a
missing one is one error that says which file to place where (or ``download=True``), and a
download that fails (no network) says so, not a raw ``ConnectionError``."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from alchemi_core.errors import ModelNotAvailableError


@pytest.fixture
def no_cache(monkeypatch, tmp_path):
    """No downloaded checkpoints: an empty home (sevenn's cache) and no model directory."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ALCHEMI_MODEL_DIR", raising=False)


def _refuse_download(*args, **kwargs):
    raise AssertionError("sevenn was asked to download although download=False")


def test_a_missing_name_says_which_file_to_place_where_and_downloads_nothing(no_cache, monkeypatch, tmp_path):
    import sevenn.util
    from alchemi_sevennet import SevenNetModel

    monkeypatch.setattr(sevenn.util, "download_checkpoint", _refuse_download)
    with pytest.raises(ModelNotAvailableError) as err:
        SevenNetModel("7net-omat")
    message = str(err.value)
    cache = os.path.join(str(tmp_path / "home"), ".cache", "sevennet", "SevenNet_omat", "checkpoint_sevennet_omat.pth")
    assert "'7net-omat' is not on this machine" in message
    assert "place checkpoint_sevennet_omat.pth (from https://" in message and cache in message
    assert "ALCHEMI_MODEL_DIR" in message and "download=True" in message


@pytest.mark.parametrize("error", ["requests", "urllib"])
def test_a_download_that_fails_is_reported_with_where_to_place_the_file(no_cache, monkeypatch, tmp_path, error):
    import requests
    import sevenn.util
    from alchemi_sevennet import SevenNetModel

    def offline(path, url):
        if error == "requests":
            raise requests.exceptions.ConnectionError(f"Failed to resolve {url}")
        from urllib.error import URLError

        raise URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(sevenn.util, "download_checkpoint", offline)
    monkeypatch.setenv("ALCHEMI_MODEL_DIR", str(tmp_path / "models"))
    with pytest.raises(ModelNotAvailableError) as err:
        SevenNetModel("7net-mf-ompa", modal="mpa", download=True)
    message = str(err.value)
    assert "model:sevennet: could not download '7net-mf-ompa'" in message
    assert ("ConnectionError" if error == "requests" else "URLError") in message
    assert "place checkpoint_sevennet_mf_ompa.pth (from https://" in message
    assert f"in {tmp_path / 'models'} ($ALCHEMI_MODEL_DIR)" in message


def test_a_name_resolves_from_the_model_directory(no_cache, monkeypatch, tmp_path, seven_net):
    import sevenn.util
    from alchemi_sevennet import SevenNetModel
    from alchemi_sevennet.model import checkpoint_file

    models = tmp_path / "models"
    models.mkdir()
    # 7net-0's weights under 7net-omat's file name: what matters is which file the name finds
    shutil.copy(sevenn.util.pretrained_name_to_path("7net-0"), models / "checkpoint_sevennet_omat.pth")
    monkeypatch.setenv("ALCHEMI_MODEL_DIR", str(models))
    monkeypatch.setattr(sevenn.util, "download_checkpoint", _refuse_download)
    assert checkpoint_file("7net-omat") == str(models / "checkpoint_sevennet_omat.pth")
    assert checkpoint_file("SevenNet-omat") == str(models / "checkpoint_sevennet_omat.pth")
    loaded = SevenNetModel("7net-omat")
    assert loaded.card.cutoff == seven_net.card.cutoff and loaded.card.species == seven_net.card.species


def test_every_name_sevenn_downloads_has_a_place():
    """Guards the naming alchemi relies on (each download's file is checkpoint_sevennet_<name>.pth)."""
    import sevenn._const
    from alchemi_sevennet.model import DOWNLOADS, _download_place

    downloads = {os.path.basename(p) for p in sevenn._const.CHECKPOINT_DOWNLOAD_LINKS}
    found = {_download_place(f"7net-{f[len('checkpoint_sevennet_'):-4].replace('_', '-')}")[0] for f in downloads}
    assert found == downloads
    # alchemi's own copy of sevenn's private table: the same folders (relative to sevenn's) and URLs
    prefix = sevenn._const._prefix
    assert {os.path.basename(p): (os.path.relpath(os.path.dirname(p), prefix), url)
            for p, url in sevenn._const.CHECKPOINT_DOWNLOAD_LINKS.items()} == DOWNLOADS
    assert _download_place("7net-0") is None and _download_place("my.pth") is None


def test_list_components_models_shows_shipped_and_placed_checkpoints(no_cache, monkeypatch, tmp_path):
    import sevenn.util
    from click.testing import CliRunner

    from alchemi_core.cli import main

    monkeypatch.setattr(sevenn.util, "download_checkpoint", _refuse_download)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "checkpoint_sevennet_omat.pth").write_bytes(b"x")
    monkeypatch.setenv("ALCHEMI_MODEL_DIR", str(tmp_path / "models"))
    listed = json.loads(CliRunner().invoke(main, ["list-components", "--models", "--json"]).output)
    seven = {m["name"]: m["path"] for m in listed["models"] if m["component"] == "model:sevennet"}
    assert seven["7net-0"] == str(sevenn.util.pretrained_name_to_path("7net-0"))  # ships with sevenn
    assert seven["7net-omat"] == str(tmp_path / "models" / "checkpoint_sevennet_omat.pth")
    assert seven["7net-omni"] is None
    assert {"7net-mf-ompa", "7net-omni-i8", "7net-omni-i12"} <= set(seven)
