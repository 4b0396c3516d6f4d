"""alchemi-integrators: integrators for alchemi: velocity Verlet, Langevin (BAOAB), Nose-Hoover chains, FIRE and FIRE2."""

from __future__ import annotations

__version__ = "0.1.0"
