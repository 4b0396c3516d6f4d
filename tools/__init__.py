"""Diagnostics: questions about where alchemi's time or memory goes (see ``tools/README.md``).

Run from the repository root as ``python -m tools.<name>``; they use the peer suite's inputs
(:mod:`benchmarks.spec`, :mod:`benchmarks.structures`) and are not part of the installed packages.
"""
