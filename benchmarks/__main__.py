"""``python -m benchmarks``: see :mod:`benchmarks.cli`."""

from __future__ import annotations

from benchmarks.cli import main

raise SystemExit(main())
