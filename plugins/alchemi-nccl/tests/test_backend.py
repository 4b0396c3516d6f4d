"""The torch.distributed backends without a process group: launch environment, byte views,
configuration errors, and the store signals (over an in-memory store)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from alchemi_core import registry
from alchemi_core.comm.base import PeerError
from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_nccl.backend import GlooBackend, NcclBackend, wire_view
from alchemi_nccl.launch_env import LaunchEnv
from alchemi_nccl.signals import StoreSignals

TORCHRUN = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}


def test_registry_builds_both_with_the_pipeline_timeout() -> None:
    gloo = registry.build("comm:gloo", timeout_s=7.5)
    assert isinstance(gloo, GlooBackend) and gloo.timeout_s == 7.5
    assert isinstance(registry.build("comm:nccl", timeout_s=3), NcclBackend)


def test_launch_env_reads_torchrun_variables() -> None:
    env = LaunchEnv.from_environ({**TORCHRUN, "RANK": "1", "LOCAL_RANK": "0"})
    assert (env.rank, env.world_size, env.local_rank, env.master_port) == (1, 2, 0, 29511)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({}, "RANK"),
        ({**TORCHRUN, "RANK": "2"}, "outside 0..WORLD_SIZE-1"),
        ({**TORCHRUN, "WORLD_SIZE": "two"}, "non-numeric"),
    ],
)
def test_launch_env_errors_say_how_to_launch(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        LaunchEnv.from_environ(environ)


def test_init_outside_a_launcher_names_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in TORCHRUN:
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ConfigurationError, match="torchrun --nproc-per-node"):
        GlooBackend(timeout_s=5).init()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_nccl_without_gpus_points_to_gloo(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in TORCHRUN.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigurationError, match="use comm:gloo"):
        NcclBackend(timeout_s=5).init()


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ConfigurationError, match="timeout_s"):
        GlooBackend(timeout_s=0)


def test_unjoined_backend_says_so() -> None:
    with pytest.raises(ConfigurationError, match="not initialised"):
        _ = GlooBackend().rank


@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.float64, torch.bfloat16])
def test_wire_view_aliases_the_bytes(dtype: torch.dtype) -> None:
    t = torch.ones(3, 2, dtype=dtype)
    view = wire_view(t)
    assert view.dtype == torch.uint8 and view.numel() == t.numel() * t.element_size()
    assert view.data_ptr() == t.data_ptr()  # no copy: a receive lands in the tensor itself


def test_wire_view_refuses_non_contiguous_tensors() -> None:
    with pytest.raises(InvalidDataError, match="contiguous"):
        wire_view(torch.zeros(4, 3).t())


# ---------------------------------------------------------------------- store signals
def test_failure_record_reaches_other_ranks_not_the_origin() -> None:
    store = dist.HashStore()
    origin, peer = StoreSignals(store, 1, 2, timeout_s=5), StoreSignals(store, 0, 2, timeout_s=5)
    assert peer.failure() is None
    origin.notify("rank 1 (FIRE) failed: ValueError: bad")
    origin.notify("a later report does not overwrite the first")
    assert peer.failure() == (1, "rank 1 (FIRE) failed: ValueError: bad")
    origin.raise_if_failed()  # its own record is no news to the origin
    with pytest.raises(PeerError, match="ValueError: bad") as info:
        peer.raise_if_failed()
    assert info.value.peer == 1


def test_heartbeat_reports_a_recorded_failure() -> None:
    store = dist.HashStore()
    StoreSignals(store, 1, 2, timeout_s=5).notify("rank 1 failed")
    with pytest.raises(PeerError, match="rank 1 failed"):
        StoreSignals(store, 0, 2, timeout_s=5, beat_s=0.0).beat()


def test_finish_waits_for_every_rank() -> None:
    store = dist.HashStore()
    a, b = StoreSignals(store, 0, 2, timeout_s=5), StoreSignals(store, 1, 2, timeout_s=5)
    import threading

    done = threading.Event()
    t = threading.Thread(target=lambda: (a.finish(), done.set()))
    t.start()
    assert not done.wait(0.3)  # rank 1 has not finished
    b.finish()
    t.join(5)
    assert done.is_set()


def test_finish_gives_up_on_a_silent_peer_after_the_timeout() -> None:
    store = dist.HashStore()
    waiting = StoreSignals(store, 0, 2, timeout_s=0.3)
    with pytest.raises(PeerError, match="rank 1 stopped answering"):
        waiting.finish()


def test_a_beating_peer_is_waited_for_and_a_silent_one_given_up() -> None:
    """The heartbeat thread keeps a rank alive however long its iterations are; once it stops
    (the process died), a finished rank gives up after stale_s."""
    import threading
    import time

    store = dist.HashStore()
    waiting, busy = StoreSignals(store, 0, 2, timeout_s=0.6, beat_s=0.05), StoreSignals(store, 1, 2, timeout_s=0.6, beat_s=0.05)
    assert waiting.stale_s == 0.6
    busy.start()
    errors: list[BaseException] = []
    t = threading.Thread(target=lambda: _catch(waiting.finish, errors))
    t.start()
    time.sleep(1.5)  # well past stale_s: still waiting, because rank 1 beats
    assert t.is_alive() and not errors
    busy.stop()
    t.join(5)
    assert not t.is_alive()
    assert errors and "rank 1 stopped answering" in str(errors[0])


def _catch(fn: object, errors: list[BaseException]) -> None:
    try:
        fn()  # type: ignore[operator]
    except BaseException as exc:
        errors.append(exc)


def test_signals_without_a_store_do_nothing() -> None:
    s = StoreSignals(None, 0, 2, timeout_s=1)
    s.notify("x")
    s.beat()
    s.finish()
    assert s.failure() is None


@pytest.mark.multiprocess
def test_joining_a_group_whose_peers_never_start_fails_after_the_timeout() -> None:
    import os
    import subprocess
    import sys

    from alchemi_nccl.spawn import free_port, rank_environ

    code = (
        "import time\n"
        "from alchemi_nccl.backend import GlooBackend\n"
        "start = time.monotonic()\n"
        "try:\n"
        "    GlooBackend(timeout_s=3).init()\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, round(time.monotonic() - start, 1), exc)\n"
    )
    env = rank_environ(0, 2, free_port(), os.environ)  # rank 1 is never started
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    name, waited, *message = out.stdout.split()
    assert name == "PipelineError", out.stdout + out.stderr
    assert 2.5 <= float(waited) < 15.0
    assert "same MASTER_ADDR/MASTER_PORT" in " ".join(message)
