"""Run OptiFlow's exported MSCCL++ execution plans from a PyTorch job.

Before ``torch.distributed.init_process_group(backend="nccl")``, with MSCCL++'s NCCL shim preloaded
(``LD_PRELOAD=libmscclpp_nccl.so``, ``MSCCLPP_NCCL_LIB_PATH=/path/to/libnccl.so.2``)::

    import torch.distributed as dist
    import optiflow_mscclpp
    optiflow_mscclpp.register("plans/", rank=rank, world_size=world, ranks_per_node=8, dist=dist)
    dist.init_process_group(backend="nccl")

``plans/`` is what ``optiflow export mscclpp RUN_DIR -o plans/`` wrote: proven plans and ``manifest.json`` saying what
each serves. The selector accepts a call only when a plan was made for exactly it (world size, ranks per node,
collective, in-place or out-of-place, size within the plan's range), only for SUM reductions and only on the world
group; everything else goes to NCCL. MSCCL++'s request carries neither the reduction op nor the group, so
``register(..., dist=dist)`` wraps the torch.distributed collectives to tell the selector both; a call that did not
come through them (or came with another op or group) is left to NCCL. See docs/mscclpp.md.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

PINNED_MSCCLPP_VERSION = "0.10.0"
MANIFEST_FORMAT = "optiflow-mscclpp-plans"
MANIFEST_VERSION = 1

# Collectives the selector may take. Broadcast plans carry no root (the shim matches them for any root) and AllToAll
# is kept away from the shim's misspelled ncclAllToAll symbol: both stay with NCCL.
_SERVED = ("allreduce", "allgather", "reducescatter")
_REDUCING = ("allreduce", "reducescatter")

__all__ = [
    "PINNED_MSCCLPP_VERSION",
    "PlanEntry",
    "Selector",
    "load_manifest",
    "register",
    "install_torch_guards",
    "collective_context",
]


@dataclass(frozen=True)
class PlanEntry:
    file: str  # absolute path of the plan
    name: str
    collective: str
    world_size: int
    ranks_per_node: int
    in_place: bool
    min_message_size: int
    max_message_size: int

    def serves(self, collective: str, world_size: int, ranks_per_node: int, in_place: bool, size: int) -> bool:
        return (
            self.collective == collective
            and self.world_size == world_size
            and self.ranks_per_node == ranks_per_node
            and self.in_place == in_place
            and self.min_message_size <= size <= self.max_message_size
        )


def load_manifest(plan_dir: str) -> List[PlanEntry]:
    """The plans of an exported directory. Raises ValueError naming the file and field when it is not one."""
    path = os.path.join(plan_dir, "manifest.json")
    try:
        with open(path, "r", encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise ValueError(f"{path}: cannot read the manifest: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}:{e.colno}: not JSON: {e.msg}") from None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{path}: expected \"format\": \"{MANIFEST_FORMAT}\" (written by optiflow export mscclpp)")
    if doc.get("version") != MANIFEST_VERSION:
        raise ValueError(f"{path}: expected version {MANIFEST_VERSION}, got {doc.get('version')!r}")
    entries = []
    for i, p in enumerate(doc.get("plans", [])):
        where = f"{path}: plans[{i}]"
        try:
            entry = PlanEntry(
                file=os.path.join(plan_dir, str(p["file"])),
                name=str(p["name"]),
                collective=str(p["collective"]),
                world_size=int(p["world_size"]),
                ranks_per_node=int(p["ranks_per_node"]),
                in_place=bool(p["in_place"]),
                min_message_size=int(p["min_message_size"]),
                max_message_size=int(p["max_message_size"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{where}: missing or malformed field {e}") from None
        if entry.min_message_size > entry.max_message_size:
            raise ValueError(f"{where}: min_message_size is above max_message_size")
        entries.append(entry)
    # Overlapping ranges would make MSCCL++'s unordered map pick either plan: refuse them here too.
    for a in entries:
        for b in entries:
            if a is b or (a.collective, a.world_size, a.ranks_per_node, a.in_place) != (
                b.collective,
                b.world_size,
                b.ranks_per_node,
                b.in_place,
            ):
                continue
            if a.min_message_size <= b.max_message_size and b.min_message_size <= a.max_message_size:
                raise ValueError(f"{path}: the size ranges of {a.name} and {b.name} overlap")
    return entries


# What the current torch.distributed call is, set by the guards around it (per thread: the shim calls the
# selector on the thread that launched the collective).
_context = threading.local()


class collective_context:
    """Tells the selector which reduction op and group the collective being launched uses."""

    def __init__(self, collective: str, op: Optional[str], world_group: bool):
        self._value = (collective, op, world_group)

    def __enter__(self):
        self._saved = getattr(_context, "value", None)
        _context.value = self._value
        return self

    def __exit__(self, *exc):
        _context.value = self._saved
        return False


def _current() -> Optional[tuple]:
    return getattr(_context, "value", None)


def _buffer_is_in_place(req: Any) -> Optional[bool]:
    mode = req.buffer_mode() if callable(getattr(req, "buffer_mode", None)) else getattr(req, "buffer_mode", None)
    name = str(getattr(mode, "name", mode)).upper()
    if name.endswith("OUT_OF_PLACE"):
        return False
    if name.endswith("IN_PLACE"):
        return True
    return None  # ANY or unknown: not ours to decide


class Selector:
    """MSCCL++ algorithm selector: a registered plan for exactly this call, else None (NCCL runs it)."""

    def __init__(self, entries: List[PlanEntry], algorithms: Dict[str, Any]):
        self.entries = list(entries)
        self.algorithms = dict(algorithms)  # plan name -> the Algorithm registered for it
        self.accepted = 0
        self.declined = 0

    def choose(self, req: Any) -> Optional[PlanEntry]:
        ctx = _current()
        collective = str(req.collective)
        if ctx is None or collective not in _SERVED:
            return None
        ctx_collective, op, world_group = ctx
        if ctx_collective != collective or not world_group:
            return None
        if collective in _REDUCING and op != "sum":
            return None
        in_place = _buffer_is_in_place(req)
        if in_place is None:
            return None
        # The shim passes AllGather's per-rank bytes; plans (nccl-tests convention) cover the whole output.
        size = int(req.message_size) * (int(req.world_size) if collective == "allgather" else 1)
        for e in self.entries:
            if e.serves(collective, int(req.world_size), int(req.n_ranks_per_node), in_place, size):
                return e
        return None

    def __call__(self, algorithms: Dict[str, Dict[str, Any]], req: Any):
        entry = self.choose(req)
        if entry is None:
            self.declined += 1
            return None
        algo = (algorithms or {}).get(entry.collective, {}).get(entry.name)
        if algo is None and entry.name in self.algorithms:
            # Not in the collection passed in: hand back the native algorithm registered for the plan.
            registered = self.algorithms[entry.name]
            algo = getattr(registered, "_algorithm", registered)
        if algo is None:
            self.declined += 1
            return None
        self.accepted += 1
        return algo


def _op_name(dist: Any, op: Any) -> str:
    sum_op = getattr(getattr(dist, "ReduceOp", None), "SUM", None)
    return "sum" if op is None or op == sum_op else "other"


def _is_world(dist: Any, group: Any) -> bool:
    if group is None:
        return True
    world = getattr(getattr(dist, "group", None), "WORLD", None)
    if world is None:
        world = getattr(getattr(dist, "GroupMember", None), "WORLD", None)
    return world is not None and group is world


def install_torch_guards(dist: Any) -> None:
    """Wraps torch.distributed's collectives so the selector knows their op and group. Idempotent."""
    if getattr(dist, "_optiflow_mscclpp_guarded", False):
        return
    wrapped = {
        "all_reduce": ("allreduce", True),
        "reduce_scatter": ("reducescatter", True),
        "reduce_scatter_tensor": ("reducescatter", True),
        "all_gather": ("allgather", False),
        "all_gather_into_tensor": ("allgather", False),
    }
    for fname, (collective, reduces) in wrapped.items():
        original = getattr(dist, fname, None)
        if original is None:
            continue

        def guard(*args, _orig=original, _coll=collective, _reduces=reduces, **kwargs):
            op = kwargs.get("op") if _reduces else None
            if _reduces and op is None and _coll == "allreduce" and len(args) > 1:
                op = args[1]
            if _reduces and op is None and _coll == "reducescatter" and len(args) > 2:
                op = args[2]
            group = kwargs.get("group")
            with collective_context(_coll, _op_name(dist, op) if _reduces else None, _is_world(dist, group)):
                return _orig(*args, **kwargs)

        guard.__name__ = fname
        guard.__wrapped__ = original
        setattr(dist, fname, guard)
    dist._optiflow_mscclpp_guarded = True


def register(
    plan_dir: str,
    rank: int,
    world_size: int,
    ranks_per_node: int,
    dist: Any = None,
    mscclpp_module: Any = None,
    strict_version: bool = True,
) -> Selector:
    """Registers the plans of `plan_dir` that fit this job with MSCCL++ and installs the selector.

    Call it on every rank before init_process_group. Pass `dist` (torch.distributed) to install the guards that
    tell the selector the reduction op and group; without them the selector accepts nothing.
    """
    if mscclpp_module is None:
        import mscclpp as mscclpp_module  # noqa: F811 (imported lazily: the module is optional)
    version = str(getattr(mscclpp_module, "__version__", "unknown"))
    if version.split("+")[0] != PINNED_MSCCLPP_VERSION:
        message = (
            f"optiflow_mscclpp: plans are written for MSCCL++ {PINNED_MSCCLPP_VERSION}, found {version}; "
            "the plan schema changed between versions"
        )
        if strict_version:
            raise RuntimeError(message)
        warnings.warn(message)
    import importlib

    ext = importlib.import_module(mscclpp_module.__name__ + ".ext")
    native = importlib.import_module(mscclpp_module.__name__ + "._mscclpp")
    algorithm_mod = importlib.import_module(mscclpp_module.__name__ + "._core.algorithm")
    Algorithm = algorithm_mod.Algorithm

    entries = [e for e in load_manifest(plan_dir) if e.world_size == world_size and e.ranks_per_node == ranks_per_node]
    builder = ext.AlgorithmCollectionBuilder()
    algorithms = {}
    for e in entries:
        plan = native.CppExecutionPlan(e.file, rank)
        algo = Algorithm(
            id=e.name,
            execution_plan=plan,
            constraint=Algorithm.Constraint(world_size=world_size, n_ranks_per_node=ranks_per_node),
            tags={"optiflow": 1},
        )
        builder.add_algorithm_builder(algo)
        algorithms[e.name] = algo
    selector = Selector(entries, algorithms)
    builder.set_algorithm_selector(selector)
    if dist is not None:
        install_torch_guards(dist)
    return selector
