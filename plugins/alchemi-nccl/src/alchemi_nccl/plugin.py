"""Entry point of alchemi-nccl: registers its components as strings; imports nothing heavy."""

from __future__ import annotations
