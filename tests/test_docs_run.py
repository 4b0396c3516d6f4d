"""Docs that run: every ```python block of docs/*.md, docs/dev/*.md and of every README.md in the repository runs
as written (CPU, all plugins installed), and every ``alchemi`` command in a ```console block exists
with the options it is shown with.

The blocks of one page run in order in one namespace, in an empty working directory, so a page
can build on its earlier blocks. A block that cannot run here (it needs a GPU, or several
processes under ``torchrun``) is marked, right above its fence, with an HTML comment that says
why; keep that rare::

    <!-- docs-test: skip (needs two GPUs under torchrun) -->

New pages are picked up automatically.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\s*\((?P<why>[^)]+)\)\s*-->\s*$")


def pages() -> list[Path]:
    found = sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "docs").glob("dev/*.md"))
    found += sorted(
        p for p in ROOT.glob("**/README.md")
        if not any(part.startswith(".") or part in ("node_modules", "build") for part in p.relative_to(ROOT).parts)
    )
    return found


def blocks(path: Path, lang: str) -> list[tuple[int, str, str | None]]:
    """``(line, code, skip_reason)`` of each ```lang block of ``path``."""
    text = path.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        if m.group("lang") != lang:
            continue
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.search(before)
        body = m.group("body")
        indent = m.group("indent")
        if indent:
            body = "\n".join(line[len(indent):] if line.startswith(indent) else line for line in body.splitlines())
        out.append((text[: m.start()].count("\n") + 1, body, skip.group("why") if skip else None))
    return out


def _id(p: Path) -> str:
    return str(p.relative_to(ROOT))


PYTHON_PAGES = [p for p in pages() if blocks(p, "python")]


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=_id)
def test_python_blocks_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__docs__"}
    ran = 0
    for line, code, skip in blocks(page, "python"):
        if skip:
            continue
        try:
            exec(compile(code, f"{page.relative_to(ROOT)}:{line}", "exec"), namespace)  # noqa: S102 - the docs
        except Exception as exc:
            what = f"{type(exc).__name__}: {exc}"
            raise AssertionError(f"{_id(page)}, the python block at line {line} fails: {what}") from exc
        ran += 1
    assert ran or all(s for _, _, s in blocks(page, "python"))


def _alchemi_commands(page: Path) -> list[tuple[int, list[str]]]:
    out = []
    for line, body, skip in blocks(page, "console"):
        if skip:
            continue
        for raw in body.splitlines():
            cmd = raw.strip()
            if not cmd.startswith("$ "):
                continue
            try:
                words = shlex.split(cmd[2:].split(" #", 1)[0])
            except ValueError:  # a line continued with a backslash
                words = cmd[2:].split()
            # `.venv/bin/alchemi`, `torchrun ... alchemi run`, `alchemi`
            for i, w in enumerate(words):
                if os.path.basename(w) == "alchemi":
                    out.append((line, words[i + 1:]))
                    break
    return out


CONSOLE_PAGES = [p for p in pages() if _alchemi_commands(p)]


@pytest.mark.parametrize("page", CONSOLE_PAGES, ids=_id)
def test_alchemi_commands_in_console_blocks_exist_with_their_options(page):
    import click

    from alchemi_core.cli import main

    ctx = click.Context(main)
    for line, args in _alchemi_commands(page):
        if not args or args[0].startswith("-"):
            continue
        cmd = main.get_command(ctx, args[0])
        assert cmd is not None, f"{_id(page)}:{line}: alchemi has no command {args[0]!r}"
        known = {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)}
        for word in args[1:]:
            if word.startswith("--"):
                name = word.split("=", 1)[0]
                assert name in known, f"{_id(page)}:{line}: alchemi {args[0]} has no option {name}"


def test_the_skip_marker_is_rare():
    skipped = [(p, line) for p in pages() for line, _, why in blocks(p, "python") if why]
    total = sum(len(blocks(p, "python")) for p in pages())
    assert len(skipped) <= max(3, total // 10), f"too many skipped blocks: {skipped}"


TOML_PAGES = [p for p in pages() if any("[model]" in body for _, body, _ in blocks(p, "toml"))]


@pytest.mark.parametrize("page", TOML_PAGES, ids=_id)
def test_workflow_files_in_toml_blocks_validate(page, tmp_path):
    """Every ```toml block that is a workflow (has [model]) passes validation (nothing runs)."""
    from alchemi_core.workflow import parse_workflow

    for line, body, skip in blocks(page, "toml"):
        if "[model]" in body and not skip:
            try:
                parse_workflow(body, source=f"{_id(page)}:{line}", base=tmp_path)
            except Exception as exc:
                raise AssertionError(f"{_id(page)}, the workflow at line {line} is not valid: {exc}") from exc


def test_every_installed_component_is_documented():
    from alchemi_core import registry

    text = "\n".join(p.read_text(encoding="utf-8") for p in pages())
    missing = [r.spec for r in registry.available() if r.spec not in text and r.plugin != "template"]
    assert not missing, f"components without documentation (add them to docs/components.md or a page): {missing}"


def test_the_cli_reference_is_current():
    from alchemi_core.cli.reference import render

    current = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert current == render(), "docs/cli.md is stale: python -m alchemi_core.cli.reference > docs/cli.md"
