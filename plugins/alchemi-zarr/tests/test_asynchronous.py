"""Asynchronous ZarrData: writes on a background thread, merged, in order, errors surfaced."""

from __future__ import annotations

import threading

import pytest
import torch
from zarr_test_helpers import assert_moving_writes_kept_their_moment, batch_for, memory_url, write_moving

from alchemi_core.errors import InvalidDataError
from alchemi_zarr import AtomicDataZarrReader, BackgroundWriteError, ZarrData


class GatedStore:
    """Wraps a store's append so a test decides when the background thread may write."""

    def __init__(self, store):
        self.store, self.gate, self.calls = store, threading.Event(), []
        self._append = store.append
        store.append = self.append

    def append(self, records):
        self.gate.wait(timeout=30)
        self.calls.append(records.num_systems)
        self._append(records)


def test_writes_return_before_the_store_is_written_and_flush_commits_them():
    url = memory_url()
    sink = ZarrData(url, asynchronous=True, max_pending=16)
    gated = GatedStore(sink.store)
    batch = batch_for([0, 1, 2])
    for _ in range(5):
        sink.write(batch)
        batch.system_id.add_(3)  # the dynamics go on changing the batch after the write
        batch.positions.add_(100.0)
    assert len(sink) == 15  # pending systems count against the capacity already
    assert len(AtomicDataZarrReader(url)) == 0  # nothing committed while the writer is held
    gated.gate.set()
    sink.flush()
    assert sink.store.num_systems == 15
    assert_moving_writes_kept_their_moment(ZarrData(url).read(), writes=5)
    # Writes waiting together are committed together: fewer appends than writes.
    assert sum(gated.calls) == 15 and len(gated.calls) < 5
    sink.close()


def test_capacity_counts_pending_writes():
    sink = ZarrData(memory_url(), capacity=4, asynchronous=True)
    gated = GatedStore(sink.store)
    sink.write(batch_for([0, 1, 2]))
    with pytest.raises(RuntimeError, match="holds 3 of 4"):
        sink.write(batch_for([3, 4]))
    gated.gate.set()
    sink.close()
    assert sink.read().system_id.tolist() == [0, 1, 2]


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_a_failed_background_write_is_raised_with_the_lost_systems(writer, tmp_path):
    store = memory_url() if writer == "thread" else str(tmp_path / "fail.zarr")
    sink = ZarrData(store, asynchronous=writer)
    sink.write(batch_for([0, 1]))
    sink.flush()
    other = batch_for([7, 8])
    other.set_field("fmax", torch.zeros(2, dtype=torch.float64), "system")  # fields the store lacks
    sink.write(other)
    with pytest.raises(BackgroundWriteError, match=r"2 systems were not stored \(system_id \[7, 8\]\)") as info:
        sink.flush()
    assert isinstance(info.value.__cause__, InvalidDataError)  # a child's exception is carried over
    assert len(sink) == 2  # the failed systems are no longer counted
    sink.write(batch_for([9]))
    sink.close()
    assert sink.read().system_id.tolist() == [0, 1, 9]


def test_a_failure_is_raised_by_the_next_write_so_a_run_stops():
    sink = ZarrData(memory_url(), asynchronous=True)

    def broken(records):
        raise OSError("disk full")

    sink.store.append = broken
    sink.write(batch_for([0]))
    sink._background.queue.join()  # let the writer fail
    with pytest.raises(BackgroundWriteError, match="disk full"):
        sink.write(batch_for([1]))
    sink.close()


def test_close_writes_what_is_pending_and_the_context_manager_closes():
    url = memory_url()
    with ZarrData(url, asynchronous=True) as sink:
        for i in range(6):
            sink.write(batch_for([i]))
    assert AtomicDataZarrReader(url).read_batch().system_id.tolist() == list(range(6))
    with pytest.raises(BackgroundWriteError, match="closed"):
        sink.write(batch_for([6]))


def test_pending_writes_survive_a_script_that_never_closes(tmp_path):
    """At interpreter exit the background thread is drained, not killed with data in it."""
    import subprocess
    import sys

    path = tmp_path / "exit.zarr"
    script = (
        "import torch\n"
        "from alchemi_core.testing import make_batch\n"
        "from alchemi_zarr import ZarrData\n"
        f"sink = ZarrData({str(path)!r}, asynchronous=True)\n"
        "for i in range(20):\n"
        "    b = make_batch([3, 4]); b.system_id.add_(2 * i); sink.write(b)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    assert AtomicDataZarrReader(str(path)).read_batch().system_id.tolist() == list(range(40))



def test_a_dropped_sink_commits_its_pending_writes_and_ends_its_thread():
    import gc

    url = memory_url()
    sink = ZarrData(url, asynchronous=True)
    thread = sink._background._thread
    for i in range(4):
        sink.write(batch_for([i]))
    del sink
    gc.collect()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert AtomicDataZarrReader(url).read_batch().system_id.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_host_buffers_are_reused_and_every_one_comes_back(writer, tmp_path):
    """Twenty writes through one pending slot: the snapshots reuse a few host buffers (none is
    overwritten before it was written out) and all are free again after flush."""
    store = memory_url() if writer == "thread" else str(tmp_path / "reuse.zarr")
    sink = ZarrData(store, asynchronous=writer, max_pending=1)
    staging = sink._background.staging
    write_moving(sink, writes=20)
    sink.flush()
    assert staging.free == staging.slots == 3
    slots = [staging.acquire() for _ in range(staging.slots)]
    assert sum(1 for s in slots if s.nbytes) <= 3  # no buffer per write: at most one per slot
    for s in slots:
        staging.release(s)
    assert_moving_writes_kept_their_moment(sink.read(), writes=20)
    sink.close()
