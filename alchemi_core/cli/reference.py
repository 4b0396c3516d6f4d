"""The CLI reference (``docs/cli.md``), generated from the commands themselves so it cannot drift.

Regenerate it with ``python -m alchemi_core.cli.reference > docs/cli.md``; a test fails when the
file differs from what the commands say. Only core's commands are listed (plugins may add more:
``alchemi --help`` shows them).

Example:
    >>> text = render()
    >>> "## alchemi run" in text and "--dry-run" in text
    True
"""

from __future__ import annotations

import click

HEADER = """\
# Command line reference

Generated from the commands by `python -m alchemi_core.cli.reference > docs/cli.md` (a test checks
that it is current). Every command that prints data takes `--json`; errors are one line on stderr
with exit status 2 for a configuration or input that cannot work, 1 for a run that failed.
`alchemi -v COMMAND` (or `ALCHEMI_VERBOSE=1`) shows Warp's messages and full tracebacks;
`-h`/`--help` after any command prints its help.
"""


def _commands() -> list[tuple[str, click.Command]]:
    from alchemi_core.cli import _BUILTIN_COMMANDS, _LAZY_COMMANDS, _load, main

    out: list[tuple[str, click.Command]] = [("alchemi", main)]
    names = sorted(set(_BUILTIN_COMMANDS) | set(_LAZY_COMMANDS))
    for name in names:
        cmd = _BUILTIN_COMMANDS.get(name) or _load(_LAZY_COMMANDS[name])
        out.append((f"alchemi {name}", cmd))
    return out


def _option_rows(cmd: click.Command, ctx: click.Context) -> list[tuple[str, str]]:
    rows = []
    for p in cmd.get_params(ctx):
        if isinstance(p, click.Argument) or "--help" in p.opts:  # every command takes -h/--help
            continue
        record = p.get_help_record(ctx)
        if record is not None:
            rows.append(record)
    return rows


def render() -> str:
    """The reference as Markdown."""
    parts = [HEADER]
    for title, cmd in _commands():
        ctx = click.Context(cmd, info_name=title)
        usage = cmd.collect_usage_pieces(ctx)
        parts.append(f"## {title}\n")
        parts.append(" ".join((cmd.help or "").strip().split("\n\n")[0].split()) + "\n")
        parts.append("```text\n" + " ".join([title, *usage]) + "\n```\n")
        if isinstance(cmd, click.Group):
            continue
        rows = _option_rows(cmd, ctx)
        if rows:
            parts.append("| option | meaning |\n| --- | --- |")
            for opt, text in rows:
                opt, text = opt.replace("|", "/"), " ".join(text.replace("|", "/").split())
                parts.append(f"| `{opt}` | {text} |")
            parts.append("")
    return "\n".join(parts).rstrip() + "\n"


if __name__ == "__main__":  # python -m alchemi_core.cli.reference > docs/cli.md
    print(render(), end="")
