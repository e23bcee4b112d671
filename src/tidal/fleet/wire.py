"""What travels between the orchestrator and a remote pool: result batches up, assignments down.

Results (``encode_results`` / ``decode_results``): one canonical JSON document per batch,

    {"batch_id": ..., "format": 1, "lease_id": ..., "results": [RolloutResult, ...]}

with sorted keys, no spaces and ASCII only, so the same batch always gives the same bytes (the
bytes a lease signs, ``auth.sign``). Every field of RolloutResult, Span, Trajectory, Segment,
EpisodeStats, IntegrityResult and Finding is written under its own name, read back by its type
annotation and checked: floats are written as Python's ``repr`` (the shortest text that reads
back to the same double), so they round-trip bit for bit; NaN and ±inf travel as JSON's
``NaN`` / ``Infinity`` extensions (Python reads them; ``verify`` rejects them where they may not
be). A field that is missing, unknown, or of the wrong type is one ``WireError`` naming its
path (``results[0].trajectories[3].segments[0].logprobs[7]``). The codec is driven by the
dataclasses' annotations, so a field added to one of them travels without a change here.

Assignments (``encode_assignment`` / ``decode_assignment``) carry their tasks **by reference**:
``(step, group_ids)`` plus the task ids. Tasks are environment objects (frozen dataclasses of
tuples, dicts, hidden tests; a user's environment may hold anything), so JSON would need a codec
per environment. They need none: ``orchestrator.planning.training_tasks(cfg, env, step)`` is a pure
function of the run's config and the step, and ``split_step`` makes group id ``g`` the ``g``-th
task of that list, so a worker built from the same config rebuilds exactly the assigned tasks
(``StepTasks``). The task ids travel too and are compared with what the worker rebuilt: a worker
whose config or environment differs gets a clear error instead of training on other tasks.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidal.errors import UserError
from tidal.orchestrator.planning import training_tasks
from tidal.orchestrator.worker import Assignment, RolloutResult
from tidal.trajectory import Segment

WIRE_FORMAT = 1
"""Version of the batch document; a reader refuses another."""
ADDED_FIELDS: dict[type, set[str]] = {Segment: {"reward"}}
"""Fields added to a dataclass after format 1 was fixed: a batch from an older sender lacks them,
and they take their default (every other missing field is a WireError)."""


class WireError(UserError):
    """A batch or assignment that does not decode; ``field`` is the path of the bad value."""

    def __init__(self, field: str, problem: str):
        self.field = field
        super().__init__(f"{field}: {problem}")


@dataclass
class WireBatch:
    """One uploaded batch: the lease that produced it, its id (unique per lease: a retry resends
    the same id, ``auth.ReplayGuard``), and its results."""

    lease_id: str
    batch_id: str
    results: list[RolloutResult]


# ------------------------------------------------------------------ results


def encode_results(results: list[RolloutResult], *, lease_id: str, batch_id: str) -> bytes:
    """The canonical JSON bytes of one batch (see the module docstring)."""
    doc = {"format": WIRE_FORMAT, "lease_id": lease_id, "batch_id": batch_id, "results": results}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=True, default=_fields).encode("ascii")


def decode_results(body: bytes) -> WireBatch:
    """The batch in ``body``, every value checked against its field's type; WireError if not."""
    doc = _parse(body)
    _keys(doc, "", {"format", "lease_id", "batch_id", "results"})
    if not (_is_int(doc["format"]) and doc["format"] == WIRE_FORMAT):
        raise WireError("format", f"batch format {_kind(doc['format'])}, this orchestrator reads "
                                  f"{WIRE_FORMAT}; run the same tidal version on both sides")
    return WireBatch(lease_id=_decode(doc["lease_id"], str, "lease_id"),
                     batch_id=_decode(doc["batch_id"], str, "batch_id"),
                     results=_decode(doc["results"], list[RolloutResult], "results"))


def _fields(obj: Any) -> dict[str, Any]:
    """json's hook for what it cannot write itself: a dataclass as {field: value}."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    raise TypeError(f"cannot put a {type(obj).__name__} on the wire")


def _parse(body: bytes) -> dict:
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError included
        raise WireError("body", f"not a JSON document ({type(e).__name__}: {str(e)[:200]})") from None
    return doc


# ------------------------------------------------------------------ the typed decoder

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}
    return _HINTS[cls]


def _decode(value: Any, tp: Any, path: str) -> Any:
    """``value`` (parsed JSON) as an instance of annotation ``tp``, checked all the way down."""
    if tp in _SCALARS:
        return _SCALARS[tp](value, path)
    if dataclasses.is_dataclass(tp):
        return _decode_dataclass(value, tp, path)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return _decode_optional(value, args, path)
    if origin is list:
        return _decode_list(value, args[0], path)
    if origin is tuple:
        return _decode_tuple(value, args, path)
    if origin is dict and args[0] is str:
        if not isinstance(value, dict):
            raise WireError(path, f"expected an object, got {_kind(value)}")
        return {k: _decode(v, args[1], f"{path}[{k!r}]") for k, v in value.items()}
    raise TypeError(f"{path}: the wire has no decoder for {tp!r}; add one to tidal.fleet.wire")


def _decode_dataclass(value: Any, cls: type, path: str) -> Any:
    hints = _hints(cls)
    absent = ADDED_FIELDS.get(cls, set()) - value.keys() if isinstance(value, dict) else set()
    _keys(value, path, set(hints) - absent)
    kwargs = {name: _decode(value[name], tp, f"{path}.{name}") for name, tp in hints.items()
              if name not in absent}
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:  # the dataclass's own invariant (Segment, Finding)
        raise WireError(path, str(e)) from None


def _decode_optional(value: Any, args: tuple, path: str) -> Any:
    present = [a for a in args if a is not type(None)]
    if len(present) != 1:
        raise TypeError(f"{path}: the wire decodes only `X | None` unions, not {args!r}")
    return None if value is None else _decode(value, present[0], path)


def _decode_list(value: Any, item: Any, path: str) -> list:
    if not isinstance(value, list):
        raise WireError(path, f"expected a list, got {_kind(value)}")
    fast = _FAST_LISTS.get(item)
    if fast is not None and all(fast(v) for v in value):  # token ids, logprobs: no per-item path
        return [float(v) for v in value] if item is float else value
    return [_decode(v, item, f"{path}[{i}]") for i, v in enumerate(value)]


def _decode_tuple(value: Any, args: tuple, path: str) -> tuple:
    if not isinstance(value, list):
        raise WireError(path, f"expected a list, got {_kind(value)}")
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_decode(v, args[0], f"{path}[{i}]") for i, v in enumerate(value))
    if len(value) != len(args):
        raise WireError(path, f"expected {len(args)} items, got {len(value)}")
    return tuple(_decode(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args)))


def _keys(value: Any, path: str, expected: set[str]) -> None:
    """``value`` is an object with exactly the keys ``expected`` (``path`` "": the document)."""
    if not isinstance(value, dict):
        raise WireError(path or "body", f"expected an object, got {_kind(value)}")
    missing, unknown = expected - value.keys(), value.keys() - expected
    if missing:
        name = min(missing)
        raise WireError(f"{path}.{name}" if path else name, "missing")
    if unknown:
        raise WireError(path or "body", f"unknown field {min(unknown)[:80]!r} (the sender "
                                        "runs another tidal version?)")


def _is_int(v: Any) -> bool:
    return type(v) is int


def _is_number(v: Any) -> bool:
    return type(v) is float or type(v) is int


def _int(v: Any, path: str) -> int:
    if not _is_int(v):
        raise WireError(path, f"expected an integer, got {_kind(v)}")
    return v


def _float(v: Any, path: str) -> float:
    if not _is_number(v):
        raise WireError(path, f"expected a number, got {_kind(v)}")
    return float(v)


def _str(v: Any, path: str) -> str:
    if not isinstance(v, str):
        raise WireError(path, f"expected a string, got {_kind(v)}")
    return v


def _bool(v: Any, path: str) -> bool:
    if not isinstance(v, bool):
        raise WireError(path, f"expected true or false, got {_kind(v)}")
    return v


_SCALARS: dict[Any, Callable[[Any, str], Any]] = {int: _int, float: _float, str: _str, bool: _bool}
_FAST_LISTS: dict[Any, Callable[[Any], bool]] = {int: _is_int, float: _is_number}


def _kind(v: Any) -> str:
    """What a bad value is, briefly (never the whole value: it may be large)."""
    if v is None:
        return "null"
    if isinstance(v, (bool, int, float)):
        return f"{type(v).__name__} {v!r}"
    if isinstance(v, str):
        return f"string {v[:40]!r}"
    return {dict: "an object", list: "a list"}.get(type(v), type(v).__name__)


# ------------------------------------------------------------------ assignments


def encode_assignment(a: Assignment) -> dict:
    """The assignment as JSON values, its tasks by reference (module docstring): group id ``g``
    is task ``g`` of step ``a.step``'s training tasks, as ``split_step`` makes them."""
    return {"assignment_id": a.assignment_id, "step": a.step, "group_ids": list(a.group_ids),
            "task_ids": [t.task_id for t in a.tasks], "min_version": a.min_version}


def decode_assignment(d: Any, tasks_for_step: Callable[[int], list]) -> Assignment:
    """The assignment ``d`` describes, its tasks rebuilt by ``tasks_for_step(step)`` (a
    ``StepTasks`` over the worker's config and environment) and checked against the sent ids."""
    _keys(d, "", {"assignment_id", "step", "group_ids", "task_ids", "min_version"})
    aid = _natural(d["assignment_id"], "assignment_id")
    step = _natural(d["step"], "step")
    min_version = _natural(d["min_version"], "min_version")
    group_ids = _decode(d["group_ids"], list[int], "group_ids")
    task_ids = _decode(d["task_ids"], list[str], "task_ids")
    if len(group_ids) != len(task_ids):
        raise WireError("task_ids", f"{len(task_ids)} task ids for {len(group_ids)} group ids")
    tasks = _rebuilt_tasks(tasks_for_step(step), step, group_ids, task_ids)
    return Assignment(aid, step, tasks, group_ids, min_version)


def _natural(v: Any, path: str) -> int:
    if _int(v, path) < 0:
        raise WireError(path, f"must be >= 0, got {v}")
    return v


def _rebuilt_tasks(step_tasks: list, step: int, group_ids: list[int], task_ids: list[str]) -> list:
    out = []
    for i, (g, tid) in enumerate(zip(group_ids, task_ids)):
        if not 0 <= g < len(step_tasks):
            raise WireError(f"group_ids[{i}]", f"task {g} of step {step}, which has "
                            f"{len(step_tasks)} tasks here: {_SAME_RUN}")
        if step_tasks[g].task_id != tid:
            raise WireError(f"task_ids[{i}]", f"the orchestrator assigned task {tid[:80]!r}, "
                            f"this worker rebuilt {step_tasks[g].task_id!r}: {_SAME_RUN}")
        out.append(step_tasks[g])
    return out


_SAME_RUN = ("the worker must run with the orchestrator's config (env.name, env.args, run.seed, "
             "orchestrator.tasks_per_step, env.integrity.canary_rate) and tidal version")


class StepTasks:
    """``step -> training_tasks(cfg, env, step)`` for ``decode_assignment``, remembering the last
    ``keep`` steps (a step's assignments arrive close together; sampling tasks may be slow)."""

    def __init__(self, cfg: Any, env: Any, keep: int = 4):
        self.cfg, self.env, self.keep = cfg, env, keep
        self._steps: OrderedDict[int, list] = OrderedDict()

    def __call__(self, step: int) -> list:
        if step not in self._steps:
            self._steps[step] = training_tasks(self.cfg, self.env, step)
            while len(self._steps) > self.keep:
                self._steps.popitem(last=False)
        return self._steps[step]
