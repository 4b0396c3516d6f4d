"""Documentation stays complete: every hook spec is documented with an example."""

from __future__ import annotations

from pathlib import Path

from alchemi_core.plugin import specs

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_every_hook_spec_is_documented():
    text = (DOCS / "plugins.md").read_text()
    for name in specs.ALL_HOOKS:
        assert f"### {name}" in text, f"docs/plugins.md lacks a section for {name}"
        section = text.split(f"### {name}", 1)[1].split("\n### ", 1)[0]
        assert "```python" in section and f"def {name}" in section, f"{name} has no example in docs"


def test_every_hook_spec_has_a_docstring_example():
    for name in specs.ALL_HOOKS:
        doc = getattr(specs, name).__doc__ or ""
        assert "Example" in doc and f"def {name}" in doc, f"{name}'s docstring lacks an example"
