"""Entry point of alchemi-hooks: registers its components as strings; imports nothing heavy."""

from __future__ import annotations
