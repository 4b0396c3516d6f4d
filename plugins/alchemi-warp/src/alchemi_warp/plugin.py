"""Entry point of alchemi-warp: registers its components as strings; imports nothing heavy."""

from __future__ import annotations
