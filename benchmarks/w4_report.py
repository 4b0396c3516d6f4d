"""W4: the two-rank pipeline's results, written by ``plugins/alchemi-nccl/benchmarks/w4_pipeline.py``
(run it under torchrun; ``--fused`` gives its one-GPU W3 baseline). ``--w4-json`` takes either or
both files; the speed-up is the pipeline's structures/hour over the fused run's, when both were
made with the same structures.

Example:
    >>> from benchmarks.w4_report import speedup
    >>> speedup([{"mode": "pipeline", "structures_per_hour": 3.6e6, "structures_in": 10},
    ...          {"mode": "fused", "structures_per_hour": 2.0e6, "structures_in": 10}])
    1.8
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from alchemi_core.errors import InvalidDataError

#: Keys the W4 script writes (checked, so a wrong file fails with a clear message).
REQUIRED = ("mode", "structures_in", "structures_out", "seconds", "structures_per_hour")


def load(paths: list[str]) -> list[dict[str, Any]]:
    """The JSON results in ``paths``.

    Raises:
        InvalidDataError: A file is missing, not JSON, or lacks the W4 script's keys.
    """
    out = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise InvalidDataError(f"--w4-json {path}: cannot read it as JSON ({exc})") from exc
        missing = [k for k in REQUIRED if k not in data]
        if missing:
            raise InvalidDataError(f"--w4-json {path}: missing {missing}; give the file w4_pipeline.py --json writes")
        out.append(data)
    return out


def speedup(results: list[dict[str, Any]]) -> float | None:
    """Pipeline over fused structures/hour, when both are there for the same structure count."""
    by_mode = {r["mode"]: r for r in results}
    pipe, fused = by_mode.get("pipeline"), by_mode.get("fused")
    if pipe is None or fused is None or pipe["structures_in"] != fused["structures_in"]:
        return None
    return pipe["structures_per_hour"] / fused["structures_per_hour"]


def run_case(paths: list[str]) -> dict[str, Any]:
    results = load(paths)
    rows = {}
    for r in results:
        rows[f"alchemi {r['mode']}"] = {
            "status": "ok",
            **r,
            "count": {
                "in": r["structures_in"],
                "out": r["structures_out"],
                "passed": r["structures_in"] == r["structures_out"],
            },
        }
    return {
        "id": "W4",
        "case": "pipeline",
        "title": "W4 W3 as a two-rank DistributedPipeline (from w4_pipeline.py --json)",
        "params": {"files": paths},
        "metric": "structures_per_hour",
        "results": rows,
        "ratios": {},
        "speedup_over_fused": speedup(results),
    }
