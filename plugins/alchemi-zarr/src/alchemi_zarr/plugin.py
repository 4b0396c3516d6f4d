"""Entry point of alchemi-zarr: registers its components as strings; imports nothing heavy."""

from __future__ import annotations
