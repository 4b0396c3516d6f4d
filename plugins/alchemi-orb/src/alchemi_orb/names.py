"""ORB models by name (``model:orb`` with ``model="orb-v3-conservative-inf-omat"``): every name
orb-models publishes (``orb_models.forcefield.pretrained.ORB_PRETRAINED_MODELS``) with a weights
file. The file a name stands for (its URL's last part, e.g.
``orb-v3-conservative-inf-omat-20250404.ckpt``) is looked for as ``$ALCHEMI_MODEL_DIR/<file>``
and in cached-path's cache (where orb-models keeps its downloads); only with ``download=True``
does cached-path fetch a missing one. A name whose file is not there is one error saying which
file to place where (:func:`alchemi_potentials.model_files.local_file`).

Example:
    >>> "orb-v3-conservative-inf-omat" in model_names()
    True
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

from alchemi_core.errors import MissingDependencyError
from alchemi_core.models.base import KnownModel
from alchemi_potentials.model_files import find_file, local_file


def pretrained() -> Any:
    """``orb_models.forcefield.pretrained``.

    Raises:
        MissingDependencyError: orb-models is not installed.
    """
    try:
        from orb_models.forcefield import pretrained as module
    except ImportError as exc:
        raise MissingDependencyError(f"model:orb needs orb-models: pip install orb-models ({exc})") from exc
    return module


def model_names() -> dict[str, str]:
    """``{name: URL of its weights}`` for every name orb-models loads weights for (the
    deprecated orb-v1 names have none)."""
    out = {}
    for name, loader in pretrained().ORB_PRETRAINED_MODELS.items():
        url = inspect.signature(loader).parameters.get("weights_path")
        if url is not None and isinstance(url.default, str):
            out[name] = url.default
    return out


def loader(name: str) -> Callable[..., Any]:
    """The function orb-models builds and loads ``name`` with (``weights_path=`` a file)."""
    return pretrained().ORB_PRETRAINED_MODELS[name]


def known_models() -> list[KnownModel]:
    """Every published name with weights, its file and where it is on this machine (if it is):
    what ``alchemi list-components --models`` shows."""
    return [KnownModel(name, os.path.basename(url), find_file(os.path.basename(url), [_cache_place(url)]))
            for name, url in model_names().items()]


def _cache_place(url: str) -> str:
    """Where cached-path keeps ``url``'s download: its newest copy, else the name it would find."""
    from cached_path import find_latest_cached, get_cache_dir, resource_to_filename

    cached = find_latest_cached(url)
    return str(cached) if cached is not None else os.path.join(str(get_cache_dir()), resource_to_filename(url))


def weights_file(name: str, download: bool = False) -> str:
    """The local weights file of the published model ``name``: ``$ALCHEMI_MODEL_DIR/<file>``,
    else cached-path's copy, else (with ``download=True``) what cached-path downloads.

    Raises:
        ModelNotAvailableError: The file is not here (which file to place where, or
            ``download=True``), or its download failed (no network).
    """
    from cached_path import cached_path

    url = model_names()[name]
    return local_file("model:orb", name, os.path.basename(url), url, [_cache_place(url)],
                      lambda: str(cached_path(url)), download)
