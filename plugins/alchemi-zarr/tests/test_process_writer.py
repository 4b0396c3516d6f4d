"""Asynchronous ZarrData written by a child process: chosen for stores another process can open,
in order, values of their moment, capacity, nothing lost when either side dies (a failed append
is tested for both writers in test_asynchronous)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from zarr_test_helpers import assert_moving_writes_kept_their_moment, batch_for, memory_url, write_moving

from alchemi_core.errors import ConfigurationError
from alchemi_core.testing.contracts import SinkContract
from alchemi_zarr import AtomicDataZarrReader, BackgroundWriteError, ZarrData


class TestZarrDataProcessWriter(SinkContract):
    @pytest.fixture(autouse=True)
    def _tmp(self, tmp_path):
        self.root = tmp_path

    def make_sink(self, capacity):
        path = self.root / f"sink-{capacity}-{id(object())}.zarr"
        return ZarrData(str(path), capacity=capacity, asynchronous="process")

    def reopen(self, sink):
        return ZarrData(sink.store.where, capacity=sink.capacity, asynchronous="process")


def test_asynchronous_true_picks_a_process_for_paths_and_a_thread_for_memory(tmp_path):
    with ZarrData(tmp_path / "a.zarr", asynchronous=True) as by_path:
        assert by_path.writer == "process"
    with ZarrData(f"file://{tmp_path}/b.zarr", asynchronous=True) as by_url:
        assert by_url.writer == "process"
    with ZarrData(memory_url(), asynchronous=True) as in_memory:
        assert in_memory.writer == "thread"
    with ZarrData(tmp_path / "c.zarr", asynchronous="thread") as chosen:
        assert chosen.writer == "thread"
    assert ZarrData(tmp_path / "d.zarr").writer is None
    with pytest.raises(ConfigurationError, match="another process can open.*asynchronous='thread'"):
        ZarrData(memory_url(), asynchronous="process")
    with pytest.raises(ConfigurationError, match="'process' or 'thread'"):
        ZarrData(tmp_path / "e.zarr", asynchronous="later")


def test_writes_are_stored_in_order_with_the_values_of_their_moment(tmp_path):
    path = str(tmp_path / "order.zarr")
    sink = ZarrData(path, asynchronous="process", max_pending=4)
    write_moving(sink, writes=12)  # the dynamics go on changing the batch after each write
    assert len(sink) == 36
    sink.flush()
    assert_moving_writes_kept_their_moment(AtomicDataZarrReader(path).read_batch(), writes=12)
    sink.close()


def test_capacity_counts_systems_the_child_has_not_committed(tmp_path):
    sink = ZarrData(str(tmp_path / "cap.zarr"), capacity=4, asynchronous="process")
    sink.write(batch_for([0, 1, 2]))
    with pytest.raises(RuntimeError, match="holds 3 of 4"):
        sink.write(batch_for([3, 4]))
    sink.close()
    assert sink.read().system_id.tolist() == [0, 1, 2]
    reopened = ZarrData(str(tmp_path / "cap.zarr"), capacity=4, asynchronous="process")
    assert len(reopened) == 3
    reopened.zero()
    assert len(reopened) == 0
    reopened.write(batch_for([9, 10, 11, 12]))
    reopened.close()
    assert reopened.read().system_id.tolist() == [9, 10, 11, 12]


def test_a_dead_writer_process_fails_its_systems_loudly(tmp_path):
    sink = ZarrData(str(tmp_path / "dead.zarr"), asynchronous="process")
    sink.write(batch_for([0]))
    sink.flush()
    child = sink._background._child
    child.kill()
    child.wait()
    sink.write(batch_for([1, 2]))
    with pytest.raises(BackgroundWriteError, match=r"system_id \[1, 2\]"):
        sink.flush()
    with pytest.raises(BackgroundWriteError, match=r"system_id \[3\]"):
        sink.write(batch_for([3]))
        sink.flush()
    assert len(sink) == 1
    assert AtomicDataZarrReader(str(tmp_path / "dead.zarr")).read_batch().system_id.tolist() == [0]


def test_a_killed_parent_leaves_what_the_child_received_committed_and_whole(tmp_path):
    """SIGKILL the stepping process after it has queued writes: the child commits every job it
    received whole, then exits."""
    path = tmp_path / "orphan.zarr"
    script = (
        "import os, signal, sys\n"
        "from alchemi_core.testing import make_batch\n"
        "from alchemi_zarr import ZarrData\n"
        f"sink = ZarrData({str(path)!r}, asynchronous='process', max_pending=64)\n"
        "for i in range(10):\n"
        "    b = make_batch([3, 4]); b.system_id.add_(2 * i); sink.write(b)\n"
        "sink.flush()\n"
        "print(sink._background._child.pid, flush=True)\n"
        "for i in range(10, 40):\n"
        "    b = make_batch([3, 4]); b.system_id.add_(2 * i); sink.write(b)\n"
        "sink._background.queue.join()  # every job is in the pipe; not necessarily committed\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == -signal.SIGKILL, run.stderr
    child_pid = int(run.stdout.split()[0])
    deadline = time.monotonic() + 60
    while _alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child_pid), "the writer process outlived its parent"
    ids = AtomicDataZarrReader(str(path)).read_batch().system_id.tolist()
    assert ids == list(range(80))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return True


class _CountingPipe:
    """Wraps the job pipe to count the bulk messages (field bytes) sent through it."""

    def __init__(self, conn):
        self.conn, self.bulk = conn, 0

    def send(self, obj):
        self.conn.send(obj)

    def send_bytes(self, data):
        self.bulk += 1
        self.conn.send_bytes(data)

    def close(self):
        self.conn.close()


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="shared staging needs memfd (Linux)")
def test_fields_reach_the_child_through_shared_memory_and_shifted_indices_through_the_pipe(tmp_path):
    from alchemi_core.testing import make_batch

    path = str(tmp_path / "shared.zarr")
    sink = ZarrData(path, asynchronous="process", max_pending=2)
    pipe = sink._background._jobs = _CountingPipe(sink._background._jobs)
    plain = make_batch([3, 4])
    for _ in range(3):
        sink.write(plain)
    sink.flush()
    assert pipe.bulk == 0  # every field was read from the staging slot
    sink.close()

    path = str(tmp_path / "edges.zarr")
    sink = ZarrData(path, asynchronous="process", max_pending=2)
    pipe = sink._background._jobs = _CountingPipe(sink._background._jobs)
    with_edges = make_batch([3, 4], edges=True)
    sink.write(with_edges)
    sink.flush()
    assert pipe.bulk == 1  # neighbor_list, shifted to per-system indices, is a new array
    assert torch.equal(sink.read().neighbor_list, with_edges.neighbor_list)
    sink.close()


def test_without_shared_memory_fields_go_through_the_pipe(tmp_path, monkeypatch):
    from alchemi_zarr import process_writer

    monkeypatch.setattr(process_writer, "shared_staging_available", lambda: False)
    path = str(tmp_path / "piped.zarr")
    sink = ZarrData(path, asynchronous="process", max_pending=1)
    write_moving(sink, writes=6)
    sink.flush()
    assert_moving_writes_kept_their_moment(AtomicDataZarrReader(path).read_batch(), writes=6)
    sink.close()


def test_a_larger_snapshot_grows_the_shared_slot_and_the_child_follows(tmp_path):
    """Small writes size the staging slots; larger ones (more atoms, and one with edges) grow a
    slot the child has mapped already: every record comes back as written."""
    from alchemi_core.testing import make_batch
    from alchemi_core.testing.contracts import assert_same_systems

    path = str(tmp_path / "grow.zarr")
    sink = ZarrData(path, asynchronous="process", max_pending=1)
    sizes = [[3, 4], [3, 4], [40, 50, 60], [3], [80, 90, 100, 110], [5, 6]]
    written = []
    for i, counts in enumerate(sizes):
        batch = make_batch(counts)
        batch.system_id.add_(100 * i)
        batch.positions.add_(float(i))
        sink.write(batch)
        written.append(batch)
    sink.flush()
    stored = AtomicDataZarrReader(path).read_batch()
    at = 0
    for batch in written:
        n = batch.num_graphs
        assert_same_systems(batch, stored.index_select(list(range(at, at + n))))
        at += n
    assert at == stored.num_graphs
    sink.close()
