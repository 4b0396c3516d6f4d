"""Helpers of alchemi-integrators' tests (a uniquely named package: every plugin's tests run in
one pytest session, so plain module names such as ``lj_reference`` could collide)."""
