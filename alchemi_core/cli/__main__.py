"""``python -m alchemi_core.cli``: the same as the ``alchemi`` command."""

from __future__ import annotations

from alchemi_core.cli import main

main()
