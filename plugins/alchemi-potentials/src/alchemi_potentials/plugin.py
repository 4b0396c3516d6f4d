"""Entry point of alchemi-potentials: registers its components as strings; imports nothing heavy."""

from __future__ import annotations
