"""Documentation stays complete: every hook spec is documented with an example."""

from __future__ import annotations

import re
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


ROOT = DOCS.parent
RESULTS = DOCS / "results"
#: A raw result cited in a page: its path under docs/results/ (with or without that prefix) in backticks.
CITED = re.compile(r"`(?:docs/results/)?(\d{4}-\d\d-\d\d/[^`\s]+)`")
#: How this repository's own GPU runs were arranged: nothing a user with a GPU and pip has.
ARRANGEMENT = re.compile(r"make-bundle|/tmp/site|\bstash|\.gpu/|pyloop|\blent\b|GPU host", re.I)


def _pages() -> list[Path]:
    return [*DOCS.glob("*.md"), *DOCS.glob("dev/*.md"), ROOT / "README.md", ROOT / "CHANGELOG.md",
            ROOT / "benchmarks" / "README.md", ROOT / "tools" / "README.md"]


def test_performance_page_is_a_reference_with_a_command_for_every_workload():
    text = (DOCS / "performance.md").read_text()
    assert len(text.splitlines()) <= 300, "docs/performance.md is a reference of at most 300 lines"
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    workloads = [s for s in sections if re.match(r"W\d", s)]
    assert [s[:2] for s in workloads] == [f"W{i}" for i in range(1, 9)]
    for section in workloads:
        assert re.search(r"`(python -m benchmarks|torchrun )", section), f"{section.splitlines()[0]}: no command"


def test_every_raw_result_is_cited_and_every_citation_exists():
    cited = {m for page in _pages() for m in CITED.findall(page.read_text())}
    missing = sorted(c for c in cited if not (RESULTS / c).is_file())
    assert not missing, f"cited in the docs but not in docs/results/: {missing}"
    stored = {p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*") if p.is_file()}
    assert stored <= cited, f"raw results no page cites (delete them): {sorted(stored - cited)}"


def test_docs_say_nothing_of_how_this_repositorys_gpu_runs_were_arranged():
    found = [(p.relative_to(ROOT).as_posix(), m.group(0)) for p in _pages() for m in ARRANGEMENT.finditer(p.read_text())]
    assert not found, f"a user has a GPU and pip: {found}"
