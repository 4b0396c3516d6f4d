"""alchemi-properties: material properties of many structures in one call, every derived
structure (scaled cell, strained cell, displaced supercell) evaluated or relaxed in batches through alchemi's engine.

Names are imported on first use, so importing the package pulls in neither torch nor ASE.

Example:
    >>> from alchemi_properties import equation_of_state, elastic_tensor
    >>> equation_of_state.__module__, elastic_tensor.__module__
    ('alchemi_properties.eos', 'alchemi_properties.elastic')
"""

from __future__ import annotations

from alchemi_core.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "equation_of_state": "alchemi_properties.eos",
    "EOSResult": "alchemi_properties.eos",
    "elastic_tensor": "alchemi_properties.elastic",
    "ElasticResult": "alchemi_properties.elastic",
    "voigt_reuss_hill": "alchemi_properties.elastic",
    "phonons": "alchemi_properties.phonons",
    "PhononResult": "alchemi_properties.phonons",
    "PhononFailure": "alchemi_properties.phonons",
    "Trajectory": "alchemi_properties.analysis",
    "rdf": "alchemi_properties.analysis",
    "msd": "alchemi_properties.analysis",
    "vacf": "alchemi_properties.analysis",
    "plot_store": "alchemi_properties.analysis",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
