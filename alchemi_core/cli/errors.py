"""How the ``alchemi`` commands report failures: one line on stderr, never a traceback.

A workflow or option that cannot work exits with status 2 (like click's usage errors); a run that
fails while running exits with 1. ``-v`` (or ``ALCHEMI_VERBOSE=1``) adds the traceback.
"""

from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import click

from alchemi_core.quiet import verbose

F = TypeVar("F", bound=Callable[..., Any])

#: Exit status of a configuration the command cannot run (a bad workflow, option or input).
USAGE = 2
#: Exit status of a run that failed while running.
FAILED = 1


def fail(message: str, status: int = USAGE) -> None:
    """Print ``alchemi: error: <message>`` (one line) and exit with ``status``."""
    click.echo(f"alchemi: error: {' '.join(str(message).split())}", err=True)
    raise SystemExit(status)


def reported(func: F) -> F:
    """Run a command body, turning alchemi's errors into one line and an exit status."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from alchemi_core.errors import (
            AlchemiError,
            ComponentNotFoundError,
            ConfigurationError,
            InvalidDataError,
            MissingDependencyError,
        )

        try:
            return func(*args, **kwargs)
        except (click.exceptions.Exit, click.ClickException, SystemExit, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - the CLI reports, -v shows the traceback
            if verbose():
                traceback.print_exc(file=sys.stderr)
            if isinstance(exc, (ConfigurationError, InvalidDataError, ComponentNotFoundError, MissingDependencyError)):
                fail(str(exc), USAGE)
            fail(str(exc) if isinstance(exc, AlchemiError) else
                 f"{type(exc).__name__}: {exc} (run with -v for the traceback)", FAILED)

    return wrapper  # type: ignore[return-value]
