"""Running one framework on one workload case safely: time caps, the shared budget, and every
failure turned into a status the tables print (nothing is silently dropped).

Example:
    >>> from benchmarks.harness import Context, ratios
    >>> ratios({"alchemi": {"status": "ok", "rate": 10.0}, "torchsim": {"status": "ok", "rate": 2.0}},
    ...        "rate", higher_is_better=True)
    {'torchsim': 5.0}
"""

from __future__ import annotations

import gc
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import torch

from benchmarks.adapters import Framework, Unavailable
from benchmarks.timing import Budget, DeadlineExceeded

#: How much of an error's traceback a result keeps (its end: the frames nearest the error).
TRACEBACK_CHARS = 6000

#: The framework every ratio is taken against.
REFERENCE = "alchemi"


@attrs.define
class Context:
    """What every workload needs: the device, the size mode, the budget and the frameworks.

    Attributes:
        frameworks: Name to adapter, or to the reason it is not available.
        scratch: A folder for stores the workloads write (W5).
    """

    device: str
    quick: bool
    budget: Budget
    frameworks: dict[str, Framework | str]
    scratch: Path
    log: Callable[[str], None] = print


def attempt(ctx: Context, name: str, cap: float, body: Callable[[Framework, float], dict[str, Any]]) -> dict[str, Any]:
    """``body(framework, deadline)`` for framework ``name``, or why it did not run.

    ``deadline`` is ``cap`` seconds from now (or the budget's end); a body that warms up first
    (compilation) takes a fresh ``ctx.budget.deadline(cap)`` after it, so the cap bounds the
    measurement and the budget bounds everything.

    Returns:
        ``body``'s figures with ``status: "ok"``, or ``status`` ``"unavailable"``, ``"skipped"``
        (budget spent), ``"timed out"`` or ``"error"`` with a ``reason``; ``wall_s`` always.
    """
    fw = ctx.frameworks.get(name)
    if fw is None or isinstance(fw, str):
        return {"status": "unavailable", "reason": fw or "not requested", "wall_s": 0.0}
    if ctx.budget.remaining() < 1.0:
        return {"status": "skipped", "reason": "the --budget-s time is spent", "wall_s": 0.0}
    deadline = ctx.budget.deadline(cap)
    start = time.perf_counter()
    try:
        out = body(fw, deadline)
        out.setdefault("status", "ok")
    except Unavailable as exc:
        out = {"status": "unavailable", "reason": str(exc)}
    except DeadlineExceeded:
        out = {"status": "timed out", "reason": f"ran past its {cap:.0f} s cap (or the --budget-s end)"}
    except Exception as exc:  # noqa: BLE001 - a peer may fail in any way; the run goes on
        traceback.print_exc(file=sys.stderr)
        # The traceback travels in the JSON too: a run on a remote machine often comes back as its
        # JSON and the tail of its output only.
        out = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"[:400],
               "traceback": traceback.format_exc()[-TRACEBACK_CHARS:]}
    finally:
        gc.collect()
        try:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        except Exception as exc:  # noqa: BLE001 - a broken device must not hide the row's figures
            print(f"{name}: device cleanup failed: {exc}", file=sys.stderr)
    out["wall_s"] = time.perf_counter() - start
    ctx.log(
        f"  {name:<10} {out['status']}"
        + (f": {out['reason']}" if "reason" in out else "")
        + f" ({out['wall_s']:.1f} s)"
    )
    return out


def ratios(results: dict[str, dict[str, Any]], key: str, higher_is_better: bool) -> dict[str, float]:
    """How many times better alchemi's ``key`` is than each peer's (peers that ran only)."""
    ref = results.get(REFERENCE, {})
    if ref.get("status") != "ok" or not ref.get(key):
        return {}
    out = {}
    for name, r in results.items():
        if name == REFERENCE or r.get("status") != "ok" or not r.get(key):
            continue
        out[name] = ref[key] / r[key] if higher_is_better else r[key] / ref[key]
    return out
