"""ProgressHook draws with each backend and counts systems and atom-steps."""

from __future__ import annotations

import io
import re

import pytest

from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import DemoDynamics, HostMemory, SizeAwareSampler
from alchemi_core.errors import ConfigurationError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_hooks.progress import ProgressHook


def test_plain_lines_show_steps_of_the_total_counts_and_throughput(molecules):
    out = io.StringIO()
    hook = ProgressHook(frequency=10, backend="plain", file=out)
    DemoDynamics(model=DemoModelWrapper(), n_steps=30, dt=0.5, hooks=[hook]).run(molecules([3, 4]))
    lines = out.getvalue().splitlines()
    # every 10 steps, and the end of the run
    assert [re.search(r"step (\d+)/30", ln).group(1) for ln in lines] == ["1", "11", "21", "30"]
    assert all("0 done, 2 active" in ln for ln in lines)
    rates = [float(re.search(r"([\d.e+]+) atom-steps/s", ln).group(1)) for ln in lines]
    assert rates[-1] > 0
    assert hook.throughput == pytest.approx(rates[-1], rel=1e-2)  # shown with 3 digits


@pytest.mark.parametrize("backend", ["tqdm", "rich"])
def test_bar_backends_write_the_counts(backend, molecules):
    pytest.importorskip(backend)
    out = io.StringIO()
    hook = ProgressHook(frequency=5, backend=backend, file=out)
    DemoDynamics(model=DemoModelWrapper(), n_steps=20, dt=0.5, hooks=[hook]).run(molecules([3, 4]))
    text = out.getvalue()
    assert "atom-steps/s" in text and "2 active" in text
    assert "20/20" in text  # the bar ends at the run's last step, not at the last update (16)


def test_streaming_run_counts_systems_done(molecule):
    data = [molecule(n, seed=i) for i, n in enumerate([3, 4, 5, 3, 4])]
    sampler = SizeAwareSampler(ListDataset(data), max_atoms=8, max_batch_size=2, bin_width=1)
    out = io.StringIO()
    hook = ProgressHook(frequency=3, backend="plain", file=out)
    DemoDynamics(
        model=DemoModelWrapper(), n_steps=6, dt=0.5, sampler=sampler, sinks=[HostMemory(None)], hooks=[hook]
    ).run()
    done = [int(re.search(r"(\d+) done", ln).group(1)) for ln in out.getvalue().splitlines()]
    assert done == sorted(done) and done[0] == 0 and done[-1] == 5  # the end: every system done
    assert out.getvalue().splitlines()[-1].split("|")[1].strip().startswith("5 done, 0 active")
    assert "/" not in out.getvalue().split("|")[0]  # no total: the run ends when systems are done


def test_unknown_backend_is_rejected():
    with pytest.raises(ConfigurationError, match="plain"):
        ProgressHook(backend="fancy")


def test_counting_structures_ends_at_the_datasets_size(molecule):
    data = [molecule(n, seed=i) for i, n in enumerate([3, 4, 5, 3, 4])]
    sampler = SizeAwareSampler(ListDataset(data), max_atoms=8, max_batch_size=2, bin_width=1)
    out = io.StringIO()
    hook = ProgressHook(frequency=3, backend="plain", file=out, structures=len(data))
    DemoDynamics(
        model=DemoModelWrapper(), n_steps=6, dt=0.5, sampler=sampler, sinks=[HostMemory(None)], hooks=[hook]
    ).run()
    lines = out.getvalue().splitlines()
    counts = [int(re.match(r"alchemi: structures (\d+)/5 \|", ln).group(1)) for ln in lines]
    assert counts == sorted(counts) and counts[-1] == 5
    with pytest.raises(ConfigurationError):
        ProgressHook(structures=0)
