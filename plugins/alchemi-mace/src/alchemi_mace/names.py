"""MACE foundation models by name (``model:mace`` with ``model_path="mace-mp-0-small"``): the
file a name stands for is looked for as ``$ALCHEMI_MODEL_DIR/<file>`` (the file name its URL
ends in) and in mace-torch's download cache (``~/.cache/mace``, where ``mace_mp``/``mace_off``
keep them); only with ``download=True`` does mace-torch's own loader fetch a missing MACE-MP
family file. A name whose file is not there is one error saying which file to place where.

Example:
    >>> "mace-mp-0-small" in FOUNDATION_NAMES and "mace-off23-medium" in FOUNDATION_NAMES
    True
"""

from __future__ import annotations

import os
from collections.abc import Callable

from alchemi_core.models import KnownModel
from alchemi_potentials.model_files import find_file, local_file

#: alchemi's name of each published MACE foundation model -> (family, mace-torch's key):
#: ``mace_mp(model=key)`` for "mp", ``mace_off(model=key)`` for "off".
FOUNDATION_NAMES: dict[str, tuple[str, str]] = {
    "mace-mp-0-small": ("mp", "small"),
    "mace-mp-0-medium": ("mp", "medium"),
    "mace-mp-0-large": ("mp", "large"),
    "mace-mp-0b-small": ("mp", "small-0b"),
    "mace-mp-0b-medium": ("mp", "medium-0b"),
    "mace-mp-0b2-small": ("mp", "small-0b2"),
    "mace-mp-0b2-medium": ("mp", "medium-0b2"),
    "mace-mp-0b2-large": ("mp", "large-0b2"),
    "mace-mp-0b3-medium": ("mp", "medium-0b3"),
    "mace-mpa-0-medium": ("mp", "medium-mpa-0"),
    "mace-omat-0-small": ("mp", "small-omat-0"),
    "mace-omat-0-medium": ("mp", "medium-omat-0"),
    "mace-matpes-pbe-0": ("mp", "mace-matpes-pbe-0"),
    "mace-matpes-r2scan-0": ("mp", "mace-matpes-r2scan-0"),
    "mace-mh-0": ("mp", "mh-0"),
    "mace-mh-1": ("mp", "mh-1"),
    "mace-off23-small": ("off", "small"),
    "mace-off23-medium": ("off", "medium"),
    "mace-off23-large": ("off", "large"),
}


def model_file(name: str | os.PathLike[str], download: bool = False) -> str | os.PathLike[str]:
    """The model file ``name`` stands for: itself when it is no foundation name (a path), else
    the first of ``$ALCHEMI_MODEL_DIR/<file>`` and mace-torch's cache that exists, downloaded
    by mace-torch with ``download=True`` (MACE-MP family) when neither does
    (:func:`alchemi_potentials.model_files.local_file`).

    Raises:
        ModelNotAvailableError: The name's file is not here (which file to place where, or
            ``download=True``), or its download failed (no network).
    """
    key = os.fspath(name)
    if key not in FOUNDATION_NAMES or os.path.isfile(key):
        return name
    file, url, cache, fetch = _where(key)
    return local_file("model:mace", key, file, url, [cache], fetch, download)


def known_models() -> list[KnownModel]:
    """Every foundation name, with its file and where it is on this machine (if it is)."""
    known = []
    for key in FOUNDATION_NAMES:
        file, _, cache, _ = _where(key)
        known.append(KnownModel(key, file, find_file(file, [cache])))
    return known


def _where(key: str) -> tuple[str, str, str, Callable[[], str] | None]:
    """``(file, url, mace-torch's cache path, its download or None)`` of foundation name ``key``."""
    family, mace_key = FOUNDATION_NAMES[key]
    from mace.calculators import foundations_models as fm

    url = (fm.mace_mp_urls if family == "mp" else fm.mace_off_urls)[mace_key]
    file = os.path.basename(url).split("?")[0]
    # mace_mp keeps a download under its URL's name with only letters, digits and _ (mace_off: as it is)
    cached = "".join(c for c in file if c.isalnum() or c == "_") if family == "mp" else file
    cache = os.path.join(str(fm.get_cache_dir()), cached)
    fetch = (lambda: str(fm.download_mace_mp_checkpoint(mace_key))) if family == "mp" else None
    return file, url, cache, fetch
