"""Real processes: a writer killed with SIGKILL mid-append, stores shared between processes."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from zarr_test_helpers import assert_matches_id, batch_for

from alchemi_core.testing.contracts import assert_same_systems
from alchemi_zarr import AtomicDataZarrReader, ZarrData

pytestmark = [pytest.mark.multiprocess, pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")]

WRITER = str(Path(__file__).parent / "crash_writer.py")
BATCH = 7


def start_writer(store: Path, *args: str, first: int = 0) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, WRITER, str(store), str(BATCH), str(first), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def check_store_after_crash(store: Path, printed: list[int]) -> int:
    """Every committed record is whole and right; the count is what the writer committed."""
    reader = AtomicDataZarrReader(str(store))
    n = len(reader)
    last_reported = printed[-1] if printed else 0
    # The writer printed after each committed write; at most the write in flight may have
    # committed without being printed.
    assert n in (last_reported, last_reported + BATCH), (n, printed)
    assert n % BATCH == 0
    for i in range(n):
        data = reader[i]
        assert int(data.system_id) == i
        assert_matches_id(data)
    # The reopened store continues after the committed records, over the crashed tail.
    sink = ZarrData(str(store))
    assert len(sink) == n
    sink.write(batch_for([n, n + 1]))
    assert_same_systems(batch_for(list(range(n + 2))), ZarrData(str(store)).read())
    return n


@pytest.mark.parametrize(
    ("key", "nth", "torn"),
    [
        ("atoms/positions/c/", 6, False),  # some fields of the record written, pointers and commit not
        ("atom_ptr/c/", 9, False),  # all data written, pointers half, commit not
        ("commit/c/", 12, False),  # everything but the commit written
        # Half a chunk written: the first append's, in place (no record in it yet), and a later
        # one's temporary file (the chunk holds committed records).
        ("atoms/positions/c/", 1, True),
        ("atoms/positions/c/", 6, True),
    ],
)
def test_sigkill_mid_append_leaves_every_committed_record_whole(tmp_path, key, nth, torn):
    store = tmp_path / "killed.zarr"
    proc = start_writer(store, "kill-at", key, str(nth), *(["torn"] if torn else []))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err
    assert f"killing before writing {key}" in err
    printed = [int(line) for line in out.split()]
    n = check_store_after_crash(store, printed)
    assert n == (nth - 1) * BATCH  # the killed append left no trace in the count


def test_sigkill_at_a_random_moment_of_continuous_writing(tmp_path):
    store = tmp_path / "random-kill.zarr"
    proc = start_writer(store, "forever")
    assert proc.stdout is not None
    printed = []
    rng = random.Random(os.getpid())
    target = rng.randint(15, 40)
    while len(printed) < target:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else "writer ended"
        printed.append(int(line))
    time.sleep(rng.uniform(0.0, 0.02))  # land somewhere inside the next appends
    proc.send_signal(signal.SIGKILL)
    rest, _ = proc.communicate(timeout=60)
    printed += [int(line) for line in rest.split()]
    assert check_store_after_crash(store, printed) >= target * BATCH


def test_a_store_written_by_one_process_is_read_and_continued_by_another(tmp_path):
    store = tmp_path / "shared.zarr"
    ZarrData(str(store)).write(batch_for(list(range(10))))
    script = (
        "import sys; sys.path.insert(0, sys.argv[2])\n"
        "from alchemi_zarr import AtomicDataZarrReader, ZarrData\n"
        "from zarr_test_helpers import assert_matches_id, batch_for\n"
        "reader = AtomicDataZarrReader(sys.argv[1])\n"
        "assert len(reader) == 10\n"
        "for i in range(10): assert_matches_id(reader[i])\n"
        "ZarrData(sys.argv[1]).write(batch_for([10, 11, 12]))\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(store), str(Path(__file__).parent)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.stdout.strip() == "ok", done.stderr
    assert_same_systems(batch_for(list(range(13))), ZarrData(str(store)).read())


def test_two_processes_appending_at_once_take_turns(tmp_path):
    """The writer lock serialises appends: no record overwrites another."""
    store = tmp_path / "two-writers.zarr"
    writers = [start_writer(store, "forever", first=start) for start in (0, 100_000)]
    counts = [0, 0]
    for k, proc in enumerate(writers):
        assert proc.stdout is not None
        for _ in range(12):
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else "writer ended"
            counts[k] += 1
    for proc in writers:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    reader = AtomicDataZarrReader(str(store))
    ids = [int(reader[i].system_id) for i in range(len(reader))]
    assert len(ids) == len(set(ids)) >= sum(counts) * BATCH
    for i in range(len(reader)):
        assert_matches_id(reader[i])
    for first in (0, 100_000):  # each writer's records are all there, in its order
        mine = [i for i in ids if first <= i < first + 100_000]
        assert mine == list(range(first, first + len(mine)))
