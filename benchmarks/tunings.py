"""A benchmark's ``--tuning``: the per-device choices of core, the potentials and the Zarr sink,
each a frozen ``Tuning`` the adapters pass to what they build.

``--tuning`` takes ``name=value`` settings joined by ``,``, each name a field of one of the three
(``alchemi_core.tuning.CoreTuning``, ``alchemi_potentials.tuning.PotentialsTuning``,
``alchemi_zarr.tuning.ZarrTuning``; no name is in two), on top of the device's measured defaults.

Example:
    >>> t = Tunings.parse("cpu", "skin=0.5,run_ahead=True")
    >>> t.potentials.skin, t.core.run_ahead, t.zarr.copy_stream
    (0.5, True, False)
"""

from __future__ import annotations

from typing import Any

import attrs

from alchemi_core.tuning import CoreTuning, evolve_from_text


@attrs.frozen
class Tunings:
    """The three plugins' choices for one run (see the module docstring)."""

    core: CoreTuning
    #: A ``PotentialsTuning`` (alchemi-potentials is imported only when one is parsed).
    potentials: Any
    #: A ``ZarrTuning``.
    zarr: Any

    @classmethod
    def parse(cls, device: str, text: str = "") -> Tunings:
        """The device's defaults with ``text``'s settings (``"skin=0.5,run_ahead=True"``)."""
        from alchemi_potentials.tuning import PotentialsTuning
        from alchemi_zarr.tuning import ZarrTuning

        bases: dict[str, Any] = {"core": CoreTuning.for_device(device), "potentials": PotentialsTuning.for_device(device),
                 "zarr": ZarrTuning.for_device(device)}
        settings: dict[str, list[str]] = {k: [] for k in bases}
        for setting in filter(None, (s.strip() for s in text.split(","))):
            name = setting.partition("=")[0].strip()
            owner = next((k for k, t in bases.items() if name in attrs.fields_dict(type(t))), None)
            if owner is None:
                known = sorted(f for t in bases.values() for f in attrs.fields_dict(type(t)))
                raise ValueError(f"--tuning {setting!r}: {name!r} is no tuning's field; fields: {', '.join(known)}")
            settings[owner].append(setting)
        return cls(**{k: evolve_from_text(bases[k], ",".join(v)) for k, v in settings.items()})
