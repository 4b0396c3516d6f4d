"""Checkpoints: everything a run needs to continue exactly where it stopped.

A checkpoint holds the active batch (positions, velocities, every integrator's state fields,
``status``, ``stage_steps``, ``system_id``, ...), the step counter, each stage's random state
(``state_dict()`` of integrators that have one), the sampler's position, the finished systems
kept in memory, and the committed state of every sink (``HostMemory`` and ``GPUBuffer`` save
their contents; a ``ZarrData`` store saves how many records it had committed, and a resumed run
cuts off the records written after the checkpoint, which it writes again). A run resumed from
it gives the same result as the uninterrupted run, with every record stored exactly once.

The file (format version 2) is one line ``alchemi-checkpoint``, one line of JSON (version, run,
step, the payload's length and SHA-256), then the payload: ``torch.save`` of plain data, written
next to its final name and renamed into place. Reading checks length and checksum, unpacks with
``weights_only=True`` (an untrusted checkpoint cannot run code) and checks that the counts agree;
a file that fails raises :class:`DamagedCheckpointError` naming the file and the run that made it.

Example:
    >>> from alchemi_core.dynamics import DemoDynamics
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> from alchemi_core.testing import make_batch
    >>> md = DemoDynamics(model=DemoModelWrapper(), n_steps=40, dt=0.5)
    >>> md.run(make_batch([3, 4]), checkpoint="run.ckpt", checkpoint_every=10)  # doctest: +SKIP
    >>> resumed = DemoDynamics(model=DemoModelWrapper(), n_steps=40, dt=0.5)
    >>> resumed.run(resume_from="run.ckpt")  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
import socket
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from alchemi_core.data import Batch
from alchemi_core.errors import DamagedCheckpointError, InvalidDataError

if TYPE_CHECKING:
    from alchemi_core.dynamics.engine import Engine

FORMAT = "alchemi-checkpoint"
VERSION = 2
MAGIC = (FORMAT + "\n").encode()
#: The header line is short; a longer first line means the file is not a checkpoint.
_MAX_HEADER = 4096


def batch_state(batch: Batch) -> dict[str, Any]:
    """A batch's contents (filled rows only) as plain tensors on the CPU."""
    return {
        # keys(): iterating a Batch gives its structures, not its field names.
        "fields": {k: getattr(batch, k).detach().cpu().clone() for k in batch.keys()},  # noqa: SIM118
        "levels": {k: batch.level_of(k).value for k in batch.keys()},  # noqa: SIM118
        "num_nodes": [int(n) for n in batch.num_nodes_list],
        "num_edges": [int(n) for n in batch.num_edges_list],
    }


def batch_from_state(state: dict[str, Any], device: torch.device | str) -> Batch:
    """The batch :func:`batch_state` described, on ``device``."""
    return Batch.from_segments(
        {k: v.to(device) for k, v in state["fields"].items()},
        state["levels"],
        num_nodes=state["num_nodes"],
        num_edges=state["num_edges"],
        device=device,
    )


def new_run_id() -> str:
    """A name for a run that checkpoints carry: unique, and telling where and when it started."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return f"{stamp}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def engine_state(engine: Engine) -> dict[str, Any]:
    """What :func:`save` writes for ``engine`` (see the module docstring)."""
    batch = engine.state.batch
    if batch is None:
        raise InvalidDataError("there is no run to checkpoint yet")
    engine.checks.settle_health(engine.state.batch)  # statuses and records of a health check still on its way
    held = engine.state.host_results
    sinks = []
    for sink in engine.state.sinks:
        flush = getattr(sink, "flush", None)
        if flush is not None:
            flush()  # a persistent sink must hold everything the checkpoint counts as written
        saver = getattr(sink, "state_dict", None)
        sinks.append(saver() if saver is not None else None)
    if engine.state.run_id is None:
        engine.state.run_id = new_run_id()
    return {
        "format": FORMAT,
        "version": VERSION,
        "run_id": engine.state.run_id,
        "device": str(batch.device),
        "step_count": engine.state.step_count,
        "loaded_count": engine.state.loaded_count,
        "written_count": engine.state.written_count,
        "sampled_count": engine.state.sampled_count,
        "batch": batch_state(batch),
        "stages": [getattr(s.dynamics, "state_dict", dict)() for s in engine.state.subs],
        "sampler": engine.state.sampler.state_dict() if engine.state.sampler is not None else None,
        "host_results": batch_state(held.read()) if held is not None and len(held) else None,
        "sinks": sinks,
    }


def save(engine: Engine, path: str | os.PathLike[str]) -> Path:
    """Write a checkpoint of ``engine`` to ``path`` (atomically: a temporary file renamed)."""
    return write_state(engine_state(engine), path)


def write_state(state: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``state`` (what :func:`engine_state` gives) as a checksummed checkpoint file."""
    payload = io.BytesIO()
    torch.save(state, payload)
    data = payload.getvalue()
    header = {
        "version": VERSION,
        "run_id": state.get("run_id"),
        "step_count": state.get("step_count"),
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "payload_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".writing")
    with open(tmp, "wb") as f:
        f.write(MAGIC)
        f.write(json.dumps(header, sort_keys=True).encode() + b"\n")
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    return target


def load(path: str | os.PathLike[str], allow_unverified: bool = False) -> dict[str, Any]:
    """Read and check a checkpoint written by :func:`save` (data only: ``weights_only=True``).

    Args:
        path: The file.
        allow_unverified: Also read a version 1 checkpoint, which has no checksum: changed bytes
            in it cannot be detected (refused without this). Pass the state it returns as a
            run's ``resume_from``.

    Raises:
        DamagedCheckpointError: The file is empty, truncated, fails its checksum, holds objects
            other than data, or its counts contradict each other.
        InvalidDataError: The file is not an alchemi checkpoint, is of a newer version, or has
            no checksum and ``allow_unverified`` is off.
    """
    raw = Path(path).read_bytes()
    if not raw:
        raise DamagedCheckpointError(f"checkpoint {path} is damaged: the file is empty (0 bytes)")
    if raw.startswith(b"PK"):
        if not allow_unverified:
            raise InvalidDataError(
                f"checkpoint {path} has no checksum (a version 1 checkpoint of an older alchemi), so "
                "changed bytes in it cannot be detected; it is refused. If you trust the file, load it with "
                "alchemi_core.dynamics.checkpoint.load(path, allow_unverified=True) and pass the state as "
                "resume_from, or start the run anew"
            )
        return _load_version_1(path, raw)
    if not raw.startswith(MAGIC):
        if _looks_like_magic(raw):
            raise DamagedCheckpointError(
                f"checkpoint {path} is damaged: its first line is cut short or garbled, so the run that made "
                "it is unknown"
            )
        raise InvalidDataError(f"{path} is not an alchemi checkpoint (it does not start with {FORMAT!r})")
    end = raw.find(b"\n", len(MAGIC), len(MAGIC) + _MAX_HEADER)
    try:
        header = json.loads(raw[len(MAGIC) : end]) if end > 0 else None
    except (ValueError, UnicodeDecodeError):
        header = None
    if not isinstance(header, dict) or not isinstance(header.get("payload_bytes"), int):
        raise DamagedCheckpointError(
            f"checkpoint {path} is damaged: its header line is unreadable, so the run that made it is unknown"
        )
    who = _made_by(header)
    version = header.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise InvalidDataError(
            f"{path} was written by a newer alchemi (checkpoint version {version!r}, this one reads up "
            f"to {VERSION}); {who}. Upgrade alchemi-core to resume it"
        )
    data = raw[end + 1 :]
    if len(data) != header["payload_bytes"]:
        raise DamagedCheckpointError(
            f"checkpoint {path} is damaged: it is truncated or extended ({len(data)} payload bytes, the "
            f"header says {header['payload_bytes']}); {who}. Resume from an earlier checkpoint or start anew"
        )
    if hashlib.sha256(data).hexdigest() != header.get("sha256"):
        raise DamagedCheckpointError(
            f"checkpoint {path} is damaged: its contents fail the SHA-256 checksum (bytes changed on disk "
            f"or in transfer); {who}. Resume from an earlier checkpoint or start anew"
        )
    state = _unpack(path, data, who)
    check_consistent(state, f"checkpoint {path}", who)
    return state


def _looks_like_magic(raw: bytes) -> bool:
    """A first line that is the format name cut short or with a few bytes changed."""
    head = raw[: len(MAGIC)]
    if MAGIC.startswith(head):
        return True
    same = sum(a == b for a, b in zip(head, MAGIC, strict=False))
    return same >= len(MAGIC) - 4


def _made_by(header: dict[str, Any]) -> str:
    return (
        f"it was made by run {header.get('run_id')!s} at step {header.get('step_count')!s} "
        f"({header.get('written_at')!s})"
    )


def _unpack(path: Any, data: bytes, who: str) -> dict[str, Any]:
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch's message suggests weights_only=False, which would let the file run code.
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        what = f"it asks for {found.group(1)}" if found else "it asks for Python objects"
        raise DamagedCheckpointError(
            f"checkpoint {path} holds objects other than tensors and plain data, which alchemi never "
            f"writes ({what}); {who}. It is refused, since loading such objects could run code: resume "
            "from a checkpoint alchemi wrote"
        ) from None
    except Exception as exc:  # a checksum-valid payload torch cannot read
        raise DamagedCheckpointError(
            f"checkpoint {path} is damaged: its payload is unreadable ({exc}); {who}"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise DamagedCheckpointError(f"checkpoint {path} is damaged: its payload is not a checkpoint state; {who}")
    return state


def _load_version_1(path: Any, raw: bytes) -> dict[str, Any]:
    """Checkpoints of format version 1 (a bare ``torch.save``, no checksum)."""
    who = "it is a version 1 checkpoint (no checksum, no run recorded)"
    state = _unpack(path, raw, who) if raw else {}
    check_consistent(state, f"checkpoint {path}", who)
    return state


def check_consistent(state: dict[str, Any], what: str, who: str) -> None:
    """Raise when the counts of ``state`` contradict each other (every structure must be
    exactly once: in the batch, already written, or still with the sampler).

    Raises:
        DamagedCheckpointError: Missing parts, or counts that disagree.
    """

    def damaged(why: str) -> DamagedCheckpointError:
        return DamagedCheckpointError(f"{what} is damaged: {why}; {who}. Resume from an earlier checkpoint")

    needed = ("step_count", "loaded_count", "written_count", "batch", "stages", "sampler", "sinks")
    missing = [k for k in needed if k not in state]
    if missing:
        raise damaged(f"it lacks {missing}")
    try:
        batch = batch_from_state(state["batch"], "cpu")
    except Exception as exc:
        raise damaged(f"its batch does not fit together ({exc})") from None
    active = batch.num_graphs
    loaded, written = int(state["loaded_count"]), int(state["written_count"])
    negative = [k for k in ("step_count", "loaded_count", "written_count") if int(state[k]) < 0]
    if negative:
        raise damaged(", ".join(f"its {k} is negative ({int(state[k])})" for k in negative))
    if loaded != written + active:
        raise damaged(
            f"it counts {loaded} systems taken in but {written} written and {active} active "
            f"({written + active})"
        )
    if "system_id" in batch:
        ids = batch.system_id.tolist()
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            raise damaged(f"its batch holds system_id {dup[:10]} more than once")
    sampler = state["sampler"]
    if sampler is not None:
        handed = [int(i) for i in sampler.get("handed_out", [])]
        if len(set(handed)) != len(handed):
            raise damaged("its sampler position hands out some structures twice")
        sampled = int(state.get("sampled_count", -1))
        if sampled >= 0 and sampled != len(handed):
            raise damaged(
                f"its sampler position says {len(handed)} structures were handed out but the run took "
                f"{sampled} from the sampler, so structures would be lost or run twice"
            )


def restore(engine: Engine, state: dict[str, Any]) -> None:
    """Put the counters, random states, sampler position, kept results and sink states of
    ``state`` back into a prepared ``engine`` (its batch already restored)."""
    _load_each(state["stages"], [s.dynamics for s in engine.state.subs], "stages")
    if state["sampler"] is not None:
        if engine.state.sampler is None:
            raise InvalidDataError("the checkpoint was taken with a sampler; give the stage the same sampler")
        engine.state.sampler.load_state_dict(state["sampler"])
    if state["host_results"] is not None:
        held = engine.admission.sink_list()[0] if not engine.state.sinks else None
        if held is not None:
            held.write(batch_from_state(state["host_results"], "cpu"))
    _load_each(state["sinks"], engine.state.sinks, "sinks")
    check_against_sinks(engine, state)
    engine.state.step_count = int(state["step_count"])
    engine.state.loaded_count = int(state["loaded_count"])
    engine.state.written_count = int(state["written_count"])
    if int(state.get("sampled_count", -1)) >= 0:
        engine.state.sampled_count = int(state["sampled_count"])
    if engine.state.sampler is not None:
        # A sampler over fewer structures than the saved one (a rerun that left out those
        # stored since) has handed out fewer: later checkpoints count from what it holds.
        engine.state.sampled_count = len(engine.state.sampler.state_dict()["handed_out"])
    engine.state.run_id = state.get("run_id") or engine.state.run_id


#: System ids a message lists before it says how many more there are.
_IDS_SHOWN = 10


def check_against_sinks(engine: Engine, state: dict[str, Any]) -> None:
    """Refuse a checkpoint whose sampler position contradicts what the sinks hold: a structure
    not run yet, or in its batch, must not be stored (it would be twice), one counted as written
    must be (it would be lost). Sinks and datasets that cannot list ``system_id``s are not checked.

    Raises:
        InvalidDataError: What differs: the ids on each side.
    """
    from alchemi_core.data.datapipes import all_system_ids
    from alchemi_core.dynamics.stored import stored_results

    saved, sampler = state["sampler"], engine.state.sampler
    if saved is None or sampler is None or not engine.state.sinks or all_system_ids(sampler.dataset) is None:
        return
    frames = range(int(engine.state.entry_status), int(engine.state.exit_status))
    found = [stored_results(sink, frames) for sink in engine.state.sinks]
    if any(f is None for f in found):
        return
    stored = set(np.concatenate(found).tolist())  # type: ignore[arg-type]
    dataset = sampler.system_ids
    handed_ids = saved.get("handed_out_ids")
    if handed_ids is None:
        positions = [int(i) for i in saved["handed_out"]]
        if any(not 0 <= i < len(dataset) for i in positions):
            raise InvalidDataError(
                f"the checkpoint's sampler handed out positions beyond the {len(dataset)} structures of this "
                "run's dataset: resume with the dataset the checkpointed run used"
            )
        handed_ids = dataset[positions].tolist()
    handed = {int(i) for i in handed_ids}
    fields = state["batch"]["fields"]
    active = set(fields["system_id"].reshape(-1).tolist()) if "system_id" in fields else set()
    held_state = state.get("host_results")
    held = set(held_state["fields"]["system_id"].reshape(-1).tolist()) if held_state else set()
    waiting = {int(i) for i in dataset.tolist()} - handed
    problems = []
    twice = sorted(waiting & stored)
    if twice:
        problems.append(f"the sinks hold {_listed(twice)}, which the checkpoint's sampler has not handed out "
                        "yet (resuming would store them twice)")
    running = sorted(active & stored)
    if running:
        problems.append(f"the sinks hold {_listed(running)}, which the checkpoint's batch is still running "
                        "(resuming would store them twice)")
    lost = sorted(handed - active - held - stored)
    if lost:
        problems.append(f"the checkpoint counts {_listed(lost)} as written, but no sink holds them (they would "
                        "be lost)")
    if problems:
        raise InvalidDataError(
            "the checkpoint's sampler position disagrees with the stored results: " + "; ".join(problems)
            + ". Resume with the sinks and dataset of the checkpointed run, or start the run anew"
        )


def _listed(ids: list[int]) -> str:
    shown = ", ".join(str(i) for i in ids[:_IDS_SHOWN])
    more = f" and {len(ids) - _IDS_SHOWN} more" if len(ids) > _IDS_SHOWN else ""
    return f"{len(ids)} structures (system_id {shown}{more})"


def _load_each(saved: list[Any], parts: list[Any], what: str) -> None:
    """``load_state_dict`` of each of ``parts`` (stages or sinks) with its saved state."""
    if len(saved) != len(parts):
        raise InvalidDataError(
            f"the checkpoint has {len(saved)} {what} but this run has {len(parts)}: resume it with the same {what}"
        )
    for part, state in zip(parts, saved, strict=True):
        loader = getattr(part, "load_state_dict", None)
        if state and loader is not None:
            loader(state)
