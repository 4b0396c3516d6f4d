"""Entry point of alchemi-integrators: registers its components as strings; imports nothing heavy."""

from __future__ import annotations
