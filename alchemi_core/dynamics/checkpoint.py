"""Checkpoints: everything a run needs to continue exactly where it stopped.

A checkpoint holds the active batch (positions, velocities, every integrator's state fields,
``status``, ``stage_steps``, ``system_id``, ...), the step counter, each stage's random state
(``state_dict()`` of integrators that have one), the sampler's position, the finished systems
kept in memory, and the contents of sinks that can save themselves (``HostMemory``; a
``ZarrData`` store persists on its own and is flushed when the checkpoint is written). A run
resumed from it gives the same result as the uninterrupted run.

The file is written next to its final name and renamed into place, so a crash while writing
leaves the previous checkpoint intact. It holds only tensors, numbers, strings, lists and
dicts, and is read with ``torch.load(weights_only=True)``: loading an untrusted checkpoint
cannot run code.

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

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from alchemi_core.data import Batch
from alchemi_core.errors import InvalidDataError

if TYPE_CHECKING:
    from alchemi_core.dynamics.engine import Engine

FORMAT = "alchemi-checkpoint"
VERSION = 1


def batch_state(batch: Batch) -> dict[str, Any]:
    """A batch's contents (filled rows only) as plain tensors on the CPU."""
    return {
        "fields": {k: getattr(batch, k).detach().cpu().clone() for k in batch.keys()},
        "levels": {k: batch.level_of(k).value for k in batch.keys()},
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


def engine_state(engine: Engine) -> dict[str, Any]:
    """What :func:`save` writes for ``engine`` (see the module docstring)."""
    batch = engine.batch
    if batch is None:
        raise InvalidDataError("there is no run to checkpoint yet")
    held = engine.host_results
    sinks = []
    for sink in engine.sinks:
        flush = getattr(sink, "flush", None)
        if flush is not None:
            flush()  # a persistent sink must hold everything the checkpoint counts as written
        saver = getattr(sink, "state_dict", None)
        sinks.append(saver() if saver is not None else None)
    return {
        "format": FORMAT,
        "version": VERSION,
        "device": str(batch.device),
        "step_count": engine.step_count,
        "loaded_count": engine.loaded_count,
        "written_count": engine.written_count,
        "batch": batch_state(batch),
        "stages": [getattr(s.dynamics, "state_dict", dict)() for s in engine.subs],
        "sampler": engine.sampler.state_dict() if engine.sampler is not None else None,
        "host_results": batch_state(held.read()) if held is not None and len(held) else None,
        "sinks": sinks,
    }


def save(engine: Engine, path: str | os.PathLike[str]) -> Path:
    """Write a checkpoint of ``engine`` to ``path`` (atomically: a temporary file renamed)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".writing")
    torch.save(engine_state(engine), tmp)
    os.replace(tmp, target)
    return target


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save` (data only: ``weights_only=True``).

    Raises:
        InvalidDataError: The file is not an alchemi checkpoint of a version this code reads.
    """
    state = torch.load(Path(path), map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise InvalidDataError(f"{path} is not an alchemi checkpoint")
    if int(state.get("version", -1)) > VERSION:
        raise InvalidDataError(
            f"{path} was written by a newer alchemi (checkpoint version {state['version']}, this one "
            f"reads up to {VERSION}); upgrade alchemi-core to resume it"
        )
    return state


def restore(engine: Engine, state: dict[str, Any]) -> None:
    """Put the counters, random states, sampler position and kept results of ``state`` back
    into a prepared ``engine`` (its batch already restored)."""
    stages = state["stages"]
    if len(stages) != len(engine.subs):
        raise InvalidDataError(
            f"the checkpoint has {len(stages)} stages but this run has {len(engine.subs)}: resume it "
            "with the same stages"
        )
    for sub, saved in zip(engine.subs, stages):
        loader = getattr(sub.dynamics, "load_state_dict", None)
        if saved and loader is not None:
            loader(saved)
    if state["sampler"] is not None:
        if engine.sampler is None:
            raise InvalidDataError("the checkpoint was taken with a sampler; give the stage the same sampler")
        engine.sampler.load_state_dict(state["sampler"])
    if state["host_results"] is not None:
        held = engine.sink_list()[0] if not engine.sinks else None
        if held is not None:
            held.write(batch_from_state(state["host_results"], "cpu"))
    for sink, saved in zip(engine.sinks, state["sinks"]):
        loader = getattr(sink, "load_state_dict", None)
        if saved is not None and loader is not None:
            loader(saved)
    engine.step_count = int(state["step_count"])
    engine.loaded_count = int(state["loaded_count"])
    engine.written_count = int(state["written_count"])
