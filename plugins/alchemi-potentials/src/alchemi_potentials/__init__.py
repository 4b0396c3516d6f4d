"""alchemi-potentials: potentials for alchemi: Lennard-Jones and Morse as Warp kernels with batched cell lists, and any ASE calculator."""

from __future__ import annotations

__version__ = "0.1.0"
