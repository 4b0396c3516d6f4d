"""Tables and JSON: one table per workload case, the same figures in the JSON.

A row per framework: its figures and checks, or why it has none; the last column is how many
times better alchemi did (its rate over the peer's, or the peer's time over its own).

Example:
    >>> case = {"id": "W2", "title": "W2 demo", "results": {"alchemi": {"status": "ok", "seconds": 0.5,
    ...         "steps": 30, "ms_per_step": 16.7, "structures_per_hour": 7.2e3,
    ...         "forces": {"max_fmax": 0.049, "passed": True}, "count": {"in": 1, "out": 1, "passed": True}},
    ...         "torchsim": {"status": "unavailable", "reason": "needs Python >= 3.12"}}, "ratios": {}}
    >>> print(render(case).splitlines()[-1])
    torchsim    unavailable: needs Python >= 3.12
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

Column = tuple[str, Callable[[dict[str, Any]], str]]


def _num(key: str, fmt: str) -> Callable[[dict[str, Any]], str]:
    def get(r: dict[str, Any]) -> str:
        value: Any = r
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return "-" if value is None else format(value, fmt)

    return get


def _check(key: str) -> Callable[[dict[str, Any]], str]:
    def get(r: dict[str, Any]) -> str:
        c = r.get(key)
        if not isinstance(c, dict) or "passed" not in c:
            return "-"
        return "pass" if c["passed"] else "FAIL"

    return get


def _temperature(r: dict[str, Any]) -> str:
    t = r.get("temperature") or {}
    if t.get("mean_K") is None:
        return "-"
    return f"{t['mean_K']:.2f}±{t['stderr_K']:.2f} {t['verdict']}"


def _fraction(key: str, part: str, whole: str) -> Callable[[dict[str, Any]], str]:
    def get(r: dict[str, Any]) -> str:
        c = r.get(key) or {}
        if part not in c:
            return "-"
        return f"{c[part]}/{c[whole]} {'pass' if c.get('passed') else 'FAIL'}"

    return get


_MD: list[Column] = [
    ("ms/step", _num("ms_per_step", ".4g")),
    ("atom-steps/s", _num("atom_steps_per_s", ".3e")),
    ("steps/s", _num("steps_per_s", ".4g")),
    ("peak B/atom", _num("peak_bytes_per_atom", ",.0f")),
    ("dev B/atom", _num("device_bytes_per_atom", ",.0f")),
    ("T (K), 2% check", _temperature),
    ("NVE meV/atom/ps", _num("nve.slope_meV_per_atom_ps", ".2g")),
    ("warm-up s", _num("warmup_s", ".3g")),
]
COLUMNS: dict[str, list[Column]] = {
    "W1": _MD,
    "W6": _MD,
    "W2": [
        ("seconds", _num("seconds", ".4g")),
        ("steps", _num("steps", "d")),
        ("ms/step", _num("ms_per_step", ".4g")),
        ("structures/h", _num("structures_per_hour", ".3e")),
        ("max fmax", _num("forces.max_fmax", ".4f")),
        ("forces", _check("forces")),
        ("count", _fraction("count", "out", "in")),
    ],
    "W3": [
        ("seconds", _num("seconds", ".4g")),
        ("structures/h", _num("structures_per_hour", ".3e")),
        ("out/in", _fraction("count", "out", "in")),
        ("converged", _fraction("relaxed", "converged", "of")),
    ],
    "W5": [
        ("ms/step", _num("ms_per_step", ".4g")),
        ("with snapshots", _num("ms_per_step_snapshots", ".4g")),
        ("slowdown %", _num("slowdown_percent", ".2f")),
        ("records", _fraction("records", "written", "expected")),
    ],
    "W4": [
        ("seconds", _num("seconds", ".4g")),
        ("structures/h", _num("structures_per_hour", ".3e")),
        ("out/in", _fraction("count", "out", "in")),
        ("converged", _num("converged", "d")),
    ],
}


def render(case: dict[str, Any]) -> str:
    """The table of one workload case."""
    columns = COLUMNS[case["id"]]
    header = ["framework"] + [c[0] for c in columns] + ["alchemi is"]
    rows, notes = [], []
    for name, r in case["results"].items():
        if r.get("status") != "ok":
            notes.append(f"{name:<11} {r.get('status')}: {r.get('reason', '')}")
            continue
        ratio = case.get("ratios", {}).get(name)
        rows.append([name] + [get(r) for _, get in columns] + ["-" if ratio is None else f"{ratio:.3g}x better"])
        if r.get("scaled"):
            notes.append(f"{name:<11} ran {r['scaled']:.2f} of the planned steps (its time cap)")
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = [case["title"], "  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)) for row in rows]
    if case.get("speedup_over_fused") is not None:
        lines.append(f"pipeline speed-up over one GPU (fused): {case['speedup_over_fused']:.3g}x")
    return "\n".join(lines + notes)


def write_json(path: str | Path, meta: dict[str, Any], cases: list[dict[str, Any]]) -> None:
    """``{"meta": ..., "workloads": [...]}`` (the tables' figures, checks and reasons)."""
    Path(path).write_text(json.dumps({"meta": meta, "workloads": cases}, indent=2, default=_plain))


def print_report(report: dict[str, Any], path: Path | None) -> int:
    """Print a diagnosis's ``report`` as JSON and write it to ``path`` too (when given); 0."""
    text = json.dumps(report, indent=1, default=_plain)
    print(text)
    if path is not None:
        path.write_text(text)
    return 0


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
