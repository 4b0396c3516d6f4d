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


def test_signals_without_a_store_do_nothing() -> None:
    s = StoreSignals(None, 0, 2, timeout_s=1)
    s.notify("x")
    s.beat()
    s.finish()
    assert s.failure() is None
