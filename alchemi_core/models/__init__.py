"""Models: the interface the engine calls for energies, forces and stress.

Example:
    >>> from alchemi_core.models import BaseModel, ModelCard
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> DemoModelWrapper().card.name
    'demo'
"""

from __future__ import annotations

from alchemi_core.models.base import BaseModel, KnownModel, Model, ModelCard, check_input, model_card

__all__ = ["BaseModel", "KnownModel", "Model", "ModelCard", "check_input", "model_card"]
