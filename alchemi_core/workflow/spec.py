"""A workflow file (TOML) read into a typed, validated :class:`Workflow`, before anything runs.

A workflow file is data: components are named ``kind:name`` and built through the registry,
parameters are plain TOML values, and nothing in the file is evaluated, unpickled or imported.
Every problem is one line that names the key and the fix (:class:`WorkflowError`). The sections
and their keys (:data:`SECTIONS`) are documented in ``docs/workflows.md``.

Example:
    >>> from alchemi_core.workflow import parse_workflow
    >>> wf = parse_workflow('''
    ... [model]
    ... component = "model:lennard-jones"
    ... epsilon = 0.0104
    ... sigma = 3.405
    ... cutoff = 8.5125
    ... [input]
    ... path = "structures/*.extxyz"
    ... [[stage]]
    ... component = "integrator:fire"
    ... n_steps = 500
    ... converge = { fmax = 0.05 }
    ... [output]
    ... path = "results.zarr"
    ... ''')
    >>> wf.stages[0].component.spec, wf.stages[0].converge
    ('integrator:fire', {'fmax': 0.05})
"""

from __future__ import annotations

import difflib
import inspect
import os
import sys
import types
import typing
from collections import abc
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from alchemi_core.errors import AlchemiError, ConfigurationError

#: Parameters the workflow itself passes to integrators: a file may not set them.
WORKFLOW_OWNED = frozenset({"model", "hooks", "sinks", "sampler", "convergence_hook"})
SECTIONS = {
    "model": ("component",),
    "input": ("path", "format", "index", "dtype", "resume_status"),
    "stage": ("component", "converge", "hook"),
    "output": ("path", "component", "trajectory_every", "log"),
    "sampler": ("max_atoms", "max_batch_size", "bin_width", "refill_frequency", "workers"),
    "checkpoint": ("path", "every"),
    "run": ("device", "seed"),
}
DTYPES = ("float32", "float64")


class WorkflowError(ConfigurationError):
    """A workflow file that cannot run: ``key`` names the place, the message the fix.

    ``str(error)`` is one line: ``<file>: <key>: <what is wrong and how to fix it>``.
    """

    def __init__(self, key: str, message: str, source: str = "workflow") -> None:
        self.key, self.message, self.source = key, message, source
        super().__init__(f"{source}: {key}: {message}")


@attrs.frozen
class ComponentSpec:
    """One component as the file names it: ``kind:name``, its parameters and where it was written."""

    spec: str
    params: dict[str, Any]
    key: str

    @property
    def kind(self) -> str:
        return self.spec.split(":", 1)[0]


@attrs.frozen
class StageSpec:
    """One ``[[stage]]``: the integrator, its convergence criteria and hooks."""

    component: ComponentSpec
    converge: dict[str, Any] | None
    hooks: tuple[ComponentSpec, ...]


@attrs.frozen
class InputSpec:
    path: str
    format: str | None = None
    index: str = ":"
    dtype: str = "float32"
    resume_status: bool = False


@attrs.frozen
class OutputSpec:
    sink: ComponentSpec | None
    path: str | None
    trajectory_every: int = 0
    log: bool = True


@attrs.frozen
class Workflow:
    """A validated workflow (see the module docstring); :func:`alchemi_core.workflow.build_plan`
    turns it into components."""

    model: ComponentSpec
    input: InputSpec | None
    stages: tuple[StageSpec, ...]
    output: OutputSpec | None
    sampler: dict[str, int]
    checkpoint: dict[str, Any] | None
    device: str = "auto"
    seed: int = 0
    source: str = "workflow"

    def describe(self) -> dict[str, Any]:
        """The resolved plan as plain data (what ``alchemi run --dry-run`` prints)."""
        return {
            "model": {"component": self.model.spec, **self.model.params},
            "input": attrs.asdict(self.input) if self.input is not None else None,
            "stages": [
                {
                    "component": s.component.spec,
                    **s.component.params,
                    **({"converge": s.converge} if s.converge else {}),
                    "hooks": [{"component": h.spec, **h.params} for h in s.hooks],
                }
                for s in self.stages
            ],
            "output": None if self.output is None else {
                "component": self.output.sink.spec if self.output.sink else None,
                "path": self.output.path,
                **(self.output.sink.params if self.output.sink else {}),
                "trajectory_every": self.output.trajectory_every,
                "log": self.output.log,
            },
            "sampler": self.sampler,
            "checkpoint": self.checkpoint,
            "device": self.device,
            "seed": self.seed,
        }


def _loads(text: str, source: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise WorkflowError("syntax", f"not valid TOML ({exc}); see https://toml.io", source) from None


def load_workflow(path: str | os.PathLike[str]) -> Workflow:
    """Read and validate the workflow file ``path``.

    Raises:
        WorkflowError: The file is missing, not TOML, or describes a workflow that cannot run.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkflowError("file", f"cannot read it ({exc.strerror}); give the path of a .toml file", str(p)) from None
    return parse_workflow(text, source=str(p), base=p.parent)


def parse_workflow(text: str, source: str = "workflow", base: str | os.PathLike[str] | None = None) -> Workflow:
    """Validate the TOML ``text`` of a workflow (see the module docstring).

    Args:
        text: The file's contents.
        source: Its name, for messages.
        base: Directory relative paths in it are taken from (default: the working directory).

    Raises:
        WorkflowError: One line naming the key and the fix.
    """
    raw = _loads(text, source)
    return _Validator(source, Path(base) if base is not None else None).workflow(raw)


class _Validator:
    def __init__(self, source: str, base: Path | None) -> None:
        self.source = source
        self.base = base

    def fail(self, key: str, message: str) -> WorkflowError:
        return WorkflowError(key, message, self.source)

    def path(self, value: str) -> str:
        if self.base is None or "://" in value or os.path.isabs(value):
            return value
        return str(self.base / value)

    # ------------------------------------------------------------------ sections
    def workflow(self, raw: dict[str, Any]) -> Workflow:
        for key in raw:
            if key not in SECTIONS:
                raise self.fail(key, f"unknown section{_did_you_mean(key, SECTIONS)}; sections are {sorted(SECTIONS)}")
        if "model" not in raw:
            raise self.fail("model", 'missing section: add [model] with component = "model:<name>"')
        model = self.component(self.table(raw, "model"), "model", "model")
        stages_raw = raw.get("stage")
        if not stages_raw:
            raise self.fail("stage", 'missing: add at least one [[stage]] with component = "integrator:<name>"')
        if not isinstance(stages_raw, list):
            raise self.fail("stage", "must be an array of tables: write [[stage]], not [stage]")
        stages = tuple(self.stage(s, f"stage[{i}]") for i, s in enumerate(stages_raw))
        run = self.table(raw, "run", required=False)
        self.only(run, "run")
        device = self.typed(run, "run", "device", str, "auto")
        seed = self.typed(run, "run", "seed", int, 0)
        sampler = self.table(raw, "sampler", required=False)
        self.only(sampler, "sampler")
        for k, v in sampler.items():
            least = 0 if k == "workers" else 1
            if not _is_int(v) or v < least:
                what = "an integer >= 0" if least == 0 else "a positive integer"
                raise self.fail(f"sampler.{k}", f"must be {what}, got {v!r}")
        checkpoint = None
        if "checkpoint" in raw:
            ck = self.table(raw, "checkpoint")
            self.only(ck, "checkpoint")
            if "path" not in ck:
                raise self.fail("checkpoint.path", 'missing: add path = "run.ckpt"')
            every = self.typed(ck, "checkpoint", "every", int, 0)
            if every < 0:
                raise self.fail("checkpoint.every", f"must be >= 0 steps, got {every}")
            checkpoint = {"path": self.path(self.typed(ck, "checkpoint", "path", str, "")), "every": every}
        return Workflow(
            model=model,
            input=self.input(raw) if "input" in raw else None,
            stages=stages,
            output=self.output(raw) if "output" in raw else None,
            sampler=dict(sampler),
            checkpoint=checkpoint,
            device=device,
            seed=seed,
            source=self.source,
        )

    def table(self, raw: Mapping[str, Any], key: str, required: bool = True) -> dict[str, Any]:
        value = raw.get(key)
        if value is None and not required:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a table ([{key}] with keys under it), got {type(value).__name__}")
        return dict(value)

    def only(self, table: Mapping[str, Any], section: str) -> None:
        allowed = SECTIONS[section]
        for k in table:
            if k not in allowed:
                raise self.fail(f"{section}.{k}",
                                f"unknown key{_did_you_mean(k, allowed)}; [{section}] takes {list(allowed)}")

    def typed(self, table: Mapping[str, Any], section: str, key: str, kind: type, default: Any) -> Any:
        if key not in table:
            return default
        value = table[key]
        ok = _is_int(value) if kind is int else isinstance(value, kind)
        if not ok:
            raise self.fail(f"{section}.{key}", f"must be {_type_name(kind)}, got {value!r} ({_toml_type(value)})")
        return value

    def input(self, raw: Mapping[str, Any]) -> InputSpec:
        t = self.table(raw, "input")
        self.only(t, "input")
        if "path" not in t:
            raise self.fail("input.path",
                            'missing: add path = "structures/*.extxyz" (a file, glob, directory or Zarr store)')
        path = self.typed(t, "input", "path", str, "")
        fmt = self.typed(t, "input", "format", str, None)
        index = self.typed(t, "input", "index", str, ":")
        dtype = self.typed(t, "input", "dtype", str, "float32")
        if dtype not in DTYPES:
            raise self.fail("input.dtype", f"must be one of {list(DTYPES)}, got {dtype!r}")
        resume = self.typed(t, "input", "resume_status", bool, False)
        return InputSpec(path=self.path(path), format=fmt, index=index, dtype=dtype, resume_status=resume)

    def output(self, raw: Mapping[str, Any]) -> OutputSpec:
        t = self.table(raw, "output")
        path = t.pop("path", None)
        if path is not None and not isinstance(path, str):
            raise self.fail("output.path", f"must be a string (the results store), got {path!r}")
        every = t.pop("trajectory_every", 0)
        if not _is_int(every) or every < 0:
            raise self.fail("output.trajectory_every", f"must be an integer >= 0 (steps), got {every!r}")
        log = t.pop("log", True)
        if not isinstance(log, bool):
            raise self.fail("output.log", f"must be true or false, got {log!r}")
        spec = t.pop("component", "sink:zarr" if path is not None else None)
        if spec is None and t:
            k = next(iter(t))
            raise self.fail(f"output.{k}", f"unknown key{_did_you_mean(k, SECTIONS['output'])}; [output] takes "
                            f"{list(SECTIONS['output'])} and the parameters of its component")
        if spec is None:
            raise self.fail("output.path", 'missing: add path = "results.zarr" (or component = "sink:<name>")')
        params = dict(t)
        if spec == "sink:zarr" and path is not None:
            params.setdefault("store", self.path(path))
        sink = self.component({"component": spec, **params}, "output", "sink")
        return OutputSpec(sink=sink, path=self.path(path) if path is not None else None, trajectory_every=int(every),
                          log=log)

    def stage(self, raw: Any, key: str) -> StageSpec:
        if not isinstance(raw, dict):
            raise self.fail(key, f"must be a table, got {type(raw).__name__}")
        t = dict(raw)
        converge = t.pop("converge", None)
        hooks_raw = t.pop("hook", [])
        if converge is not None:
            converge = self.converge(converge, f"{key}.converge")
        if isinstance(hooks_raw, dict):
            hooks_raw = [hooks_raw]
        if not isinstance(hooks_raw, list):
            raise self.fail(f"{key}.hook", "must be [[stage.hook]] tables, each with a component key")
        hooks = tuple(self.component(h, f"{key}.hook[{i}]", "hook") for i, h in enumerate(hooks_raw))
        comp = self.component(t, key, "integrator")
        for name in WORKFLOW_OWNED & set(comp.params):
            raise self.fail(f"{key}.{name}", "is set by the workflow itself; remove it "
                            "(hooks go in [[stage.hook]], convergence in converge = {...})")
        return StageSpec(component=comp, converge=converge, hooks=hooks)

    def converge(self, raw: Any, key: str) -> dict[str, Any]:
        if not isinstance(raw, dict) or not raw:
            raise self.fail(key, "must be a table such as { fmax = 0.05 } or { criteria = [...] }")
        out = dict(raw)
        for k, v in out.items():
            if k == "criteria":
                if not isinstance(v, list) or not all(isinstance(c, dict) for c in v):
                    raise self.fail(f"{key}.criteria",
                                    'must be a list of tables like { key = "fmax", threshold = 0.05 }')
            elif k == "frequency":
                if not _is_int(v) or v < 1:
                    raise self.fail(f"{key}.frequency", f"must be a positive integer (steps), got {v!r}")
            elif k in ("fmax", "energy_change"):
                if not _is_number(v) or v <= 0:
                    raise self.fail(f"{key}.{k}", f"must be a positive number, got {v!r}")
            else:
                known = ("fmax", "energy_change", "criteria", "frequency")
                raise self.fail(f"{key}.{k}", f"unknown criterion{_did_you_mean(k, known)}; use one of {list(known)}")
        return out

    # ------------------------------------------------------------------ components
    def component(self, raw: Mapping[str, Any], key: str, kind: str) -> ComponentSpec:
        from alchemi_core import registry

        if "component" not in raw:
            raise self.fail(f"{key}.component",
                            f'missing: add component = "{kind}:<name>" (alchemi list-components {kind})')
        spec = raw["component"]
        if not isinstance(spec, str):
            raise self.fail(f"{key}.component", f'must be a string such as "{kind}:<name>", got {spec!r}')
        if ":" not in spec:
            spec = f"{kind}:{spec}"
        if spec.split(":", 1)[0] != kind:
            raise self.fail(f"{key}.component", f"{spec!r} is not a {kind}; use a {kind}:<name> component "
                            f"(alchemi list-components {kind})")
        try:
            target = registry.resolve(spec)
        except AlchemiError as exc:
            raise self.fail(f"{key}.component", _one_line(str(exc))) from None
        params = {k: v for k, v in raw.items() if k != "component"}
        # A model's own parameter may be named model (model:sevennet's checkpoint): the workflow
        # passes the model to stages, never to models.
        self.check_params(target, spec, params, key, frozenset() if kind == "model" else WORKFLOW_OWNED)
        for name in getattr(target, "component_params", ()):
            if name in params:
                self.parts(params[name], f"{key}.{name}", kind)
        return ComponentSpec(spec=spec, params=params, key=key)

    def parts(self, value: Any, key: str, kind: str) -> None:
        """Check each component of a parameter that holds components (``model:sum``'s ``parts``):
        ``[[model.parts]]`` tables, each a component of its own, or ``"kind:name"`` strings."""
        if not isinstance(value, list) or not value:
            raise self.fail(key, f'must be one or more [[{key}]] tables, each with component = "{kind}:<name>"')
        for i, part in enumerate(value):
            if isinstance(part, str):
                part = {"component": part}
            if not isinstance(part, dict):
                raise self.fail(f"{key}[{i}]", f'must be a [[{key}]] table with component = "{kind}:<name>" or a '
                                f'"{kind}:<name>" string, got {part!r} ({_toml_type(part)})')
            self.component(part, f"{key}[{i}]", kind)

    def check_params(self, target: Any, spec: str, params: Mapping[str, Any], key: str,
                     owned: frozenset[str] = WORKFLOW_OWNED) -> None:
        """Check ``params`` against what ``target`` accepts; ``owned`` names the parameters the
        workflow passes itself (neither unknown nor missing when absent from the file)."""
        accepted, open_ended = accepted_parameters(target)
        for name, value in params.items():
            p = accepted.get(name)
            if p is None:
                if open_ended or name in owned:
                    continue
                names = [n for n in accepted if n not in owned]
                raise self.fail(f"{key}.{name}", f"{spec} takes no parameter {name!r}{_did_you_mean(name, names)}; "
                                f"it takes {names}")
            problem = value_problem(p.annotation, value)
            if problem:
                raise self.fail(f"{key}.{name}", f"{problem} for {spec}")
        for name, p in accepted.items():
            if p.default is inspect.Parameter.empty and name not in params and name not in owned and \
                    p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                raise self.fail(f"{key}.{name}", f"missing: {spec} needs {name} = <value>")


def accepted_parameters(target: Any) -> tuple[dict[str, inspect.Parameter], bool]:
    """The keyword parameters ``target(...)`` accepts, following ``**kwargs`` up a class's bases,
    and whether it takes arbitrary others. Each ``annotation`` is resolved to the tuple of its
    union's members (None where it cannot be read), which :func:`value_problem` checks against."""
    out: dict[str, inspect.Parameter] = {}
    chain = [c for c in getattr(target, "__mro__", ()) if "__init__" in vars(c) and c is not object]
    functions = [c.__init__ for c in chain] if chain else [target]
    for fn in functions:
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            return out, True
        namespace = getattr(inspect.unwrap(fn), "__globals__", {})
        var_kw = False
        for name, p in sig.parameters.items():
            if name == "self" or p.kind is p.VAR_POSITIONAL:
                continue
            if p.kind is p.VAR_KEYWORD:
                var_kw = True
                continue
            if name not in out:
                out[name] = p.replace(annotation=_members(p.annotation, p.default, namespace))
        if not var_kw:
            return out, False
    return out, True


def _members(annotation: Any, default: Any, namespace: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The types of the union ``annotation`` (a string under ``from __future__ import annotations``,
    evaluated in its module as ``typing.get_type_hints`` does), or None where it cannot be read.
    Without an annotation, the type of a plain default stands for it."""
    if annotation is inspect.Parameter.empty:
        return (type(default),) if isinstance(default, (bool, int, float, str)) else None
    if isinstance(annotation, str):
        # Each member alone: an alias may be a string itself ("float | torch.Tensor"), which
        # evaluating "Alias | None" as a whole cannot combine.
        out: list[Any] = []
        for part in _split_union(annotation):
            try:
                value = eval(part, dict(namespace))  # noqa: S307 - the component's own annotation, not file data
            except Exception:  # noqa: BLE001 - a name imported only for type checkers: not checkable
                return None
            got = _members(value, inspect.Parameter.empty, namespace)
            if got is None:
                return None
            out.extend(got)
        return tuple(out)
    if annotation is None:
        return (type(None),)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        out = []
        for arg in typing.get_args(annotation):
            got = _members(arg, inspect.Parameter.empty, namespace)
            if got is None:
                return None
            out.extend(got)
        return tuple(out)
    return (annotation,)


def _split_union(text: str) -> list[str]:
    """``"a | b[c | d]"`` -> ``["a", "b[c | d]"]`` (``|`` outside brackets only)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == "|" and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def value_problem(members: tuple[Any, ...] | None, value: Any) -> str | None:
    """Why the TOML ``value`` cannot stand for a parameter of the types ``members``, or None if it
    can. A parameter that takes a number or a string takes a string only as ``"info_<key>"``
    (each structure's own value from its ``atoms.info``); types no TOML value can be are left to
    the component."""
    if members is None or any(m is Any or m is object for m in members):
        return None
    if any(_matches(m, value, members) for m in members):
        return None
    wanted = _describe(members)
    if not wanted:
        return None
    return f"must be {wanted}, got {value!r} ({_toml_type(value)})"


def _numeric(members: tuple[Any, ...]) -> bool:
    return any(m in (int, float) for m in members)


def _items(member: Any) -> tuple[Any, ...] | None:
    """The member types of an array annotation's items (``()``: any; None: not an array type)."""
    origin = typing.get_origin(member) or member
    if not (isinstance(origin, type) and origin is not str and issubclass(origin, (list, tuple, abc.Sequence))):
        return None
    args = typing.get_args(member)
    items = args[:1] if len(args) == 2 and args[1] is Ellipsis else args  # tuple[X, ...]
    out: list[Any] = []
    for a in items:
        got = _members(a, inspect.Parameter.empty, {})
        if got is None:
            return ()
        out.extend(got)
    return tuple(out)


def _matches(member: Any, value: Any, members: tuple[Any, ...]) -> bool:
    """Whether ``value`` is a ``member`` (one of the union ``members``)."""
    if member is bool:
        return isinstance(value, bool)
    if member is int:
        return _is_int(value)
    if member is float:
        return _is_number(value)
    if member is str:  # with a number: a field name
        return isinstance(value, str) and (not _numeric(members) or value.startswith("info_"))
    if typing.get_origin(member) is typing.Literal:
        return any(type(value) is type(a) and value == a for a in typing.get_args(member))
    items = _items(member)
    if items is not None:
        return isinstance(value, list) and (not items or all(value_problem(items, v) is None for v in value))
    origin = typing.get_origin(member) or member
    if isinstance(origin, type) and issubclass(origin, (dict, abc.Mapping)):
        return isinstance(value, dict)
    return False


def _describe(members: tuple[Any, ...]) -> str:
    """What TOML values the union ``members`` takes, in words ("" where none can be one)."""
    words: list[str] = []
    for m in members:
        items = _items(m)
        if m is bool:
            what = "true or false"
        elif m is int:
            what = "an integer" if float not in members else ""
        elif m is float:
            what = "a number"
        elif m is str:
            what = ('"info_<key>" (each structure\'s own value from its atoms.info)' if _numeric(members)
                    else 'a string ("...")')
        elif typing.get_origin(m) is typing.Literal:
            what = f"one of {list(typing.get_args(m))}"
        elif items is not None:
            inner = _describe(items) if items else ""
            what = f"an array of {inner}" if inner else "an array [...]"
        elif isinstance(typing.get_origin(m) or m, type) and issubclass(typing.get_origin(m) or m, (dict, abc.Mapping)):
            what = "a table { ... }"
        else:
            what = ""
        if what and what not in words:
            words.append(what)
    return " or ".join(words)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _type_name(kind: type) -> str:
    names = {int: "an integer", str: 'a string ("...")', bool: "true or false", float: "a number"}
    return names.get(kind, kind.__name__)


_TOML_TYPES = ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string"), (list, "an array"),
               (dict, "a table"))


def _toml_type(v: Any) -> str:
    return next((name for kind, name in _TOML_TYPES if isinstance(v, kind)), type(v).__name__)


def _did_you_mean(name: str, options: Any) -> str:
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _one_line(text: str) -> str:
    return " ".join(text.split())
