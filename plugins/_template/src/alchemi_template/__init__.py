"""alchemi-template: an alchemi plugin adding ``integrator:template-euler``."""

from __future__ import annotations

__version__ = "0.1.0"
