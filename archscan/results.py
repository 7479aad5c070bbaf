"""Results as frozen dataclasses of raw numbers; formatting lives in ``archscan.report``."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

SCHEMA = "archscan.report/1"


# The cost category of a node, most specific first: a node made of several ops takes the first one
# it has (``archscan.costs.category_of``). Torch-free, so the report renderers use them without torch.
CATEGORIES = (
    "attention", "rnn", "conv", "grouped_conv", "depthwise_conv", "linear", "matmul", "embedding",
    "norm", "pooling", "activation", "elementwise", "reduction", "host_sync", "data_movement",
    "factory", "view", "other",
)


def module_and_ancestors(path: str) -> list[str]:
    """'a.b.c' -> ['', 'a', 'a.b', 'a.b.c']: every module whose subtree contains ``path``."""
    parts = path.split(".") if path else []
    return [""] + [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


@dataclass(frozen=True)
class NodeReport:
    """One graph node (an fx node, an exported aten op, or a recorded eager op)."""

    name: str
    op: str
    module: str
    module_type: str
    category: str
    flops: int
    elem_ops: int
    mac_bytes: int
    read_bytes: int
    write_bytes: int
    weight_bytes: int
    params: int
    out_shape: tuple[int, ...] | None
    dtype: str | None
    source: str | None = None
    inputs: tuple[str, ...] = ()
    aten_ops: tuple[str, ...] = ()
    attrs: dict = field(default_factory=dict)
    latency_ms: float | None = None
    predicted_ms: float | None = None

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, multiply-adds per byte moved."""
        return self.flops / self.mac_bytes if self.mac_bytes else 0.0


@dataclass(frozen=True)
class ModuleReport:
    """Costs summed over every node inside one module (its whole subtree)."""

    path: str
    type: str
    depth: int
    flops: int
    elem_ops: int
    mac_bytes: int
    params: int
    nodes: int
    out_shape: tuple[int, ...] | None = None
    category: str = ""
    unused_params: int = 0    # parameters under this module that forward never reads
    container: bool = False   # Sequential / ModuleList / ModuleDict (no computation of its own)
    builtin: bool = False     # a torch.nn layer (kept whole by fx)
    latency_ms: float | None = None

    @property
    def intensity(self) -> float:
        return self.flops / self.mac_bytes if self.mac_bytes else 0.0


@dataclass(frozen=True)
class Totals:
    """Whole-model totals. ``params`` counts every registered parameter once."""

    params: int
    flops: int
    mac_bytes: int
    elem_ops: int
    read_bytes: int
    write_bytes: int
    weight_bytes: int
    used_params: int
    unused_params: int
    param_bytes: int
    executed_flops: int | None = None  # what runs: causal or position-masked attention computes only the pairs its mask leaves
    active_params: int | None = None   # mixture of experts: the parameters one token uses (k of E experts)

    @property
    def intensity(self) -> float:
        return self.flops / self.mac_bytes if self.mac_bytes else 0.0


@dataclass(frozen=True)
class Finding:
    """One rule's verdict on one place in the model."""

    rule: str
    severity: str
    module: str
    message: str
    evidence: dict
    saving: dict
    fix: str = ""
    source: str | None = None


@dataclass(frozen=True)
class Recommendation:
    """One concrete change, what it saves and how to apply it (see ``archscan.recommend``)."""

    kind: str                        # fuse, sdpa, compile, low-precision, channels-last, ...
    target: tuple[str, ...]          # module paths it changes ('' is the whole model)
    reason: str
    estimated_saving: dict           # ms?, mac_bytes, flops, params, kernels
    basis: str                       # measured | predicted | mac
    apply: str                       # the archscan command or Python call that applies it
    findings: tuple[dict, ...] = ()  # {"rule", "module"} of the findings it answers
    verified: bool | None = None     # applied to the real model and checked against it
    measured_saving: dict | None = None

    def to_json(self) -> dict:
        out = asdict(self)
        out["target"], out["findings"] = list(self.target), list(self.findings)
        return {k: v for k, v in out.items() if v is not None}


@dataclass(frozen=True)
class Report:
    """Everything archscan knows about one model at one input."""

    model: str
    capture: str
    inputs: tuple[dict, ...]
    dtype: str
    totals: Totals
    nodes: tuple[NodeReport, ...]
    modules: tuple[ModuleReport, ...]
    uncounted: dict[str, int]
    capture_notes: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = ()
    latency: dict | None = None
    recommendations: tuple[Recommendation, ...] = ()
    unused_param_names: tuple[str, ...] = ()
    host_constants: tuple[dict, ...] = ()   # tensors built on the host in forward (fx constants)
    host_syncs: tuple[dict, ...] = ()       # {op, source, count}: .tolist()/.item()/bool() the graph does not show
    training: bool = False                  # the module given was in train mode
    warnings: tuple[str, ...] = ()          # what limited the analysis (a damaged device profile, ...)
    blocks: tuple[dict, ...] = ()           # building blocks and their fragmentation (G3), when rules ran
    memory: dict | None = None              # peak bytes live, by tensor lifetime (archscan.memory.summary)
    training_step: dict | None = None       # --train: the step's phases, their costs and its memory
    phases: dict | None = None              # --decode: the prefill and one decode step (archscan.llm.decode)
    kv_cache: dict | None = None            # --decode: the traced cache's bytes
    parallel: dict | None = None            # --parallel: one rank's step over a mesh (archscan.parallel)
    quant: dict | None = None               # --quant/--kv: the model quantized, before and after (archscan.quant)
    schema: str = SCHEMA

    def node(self, name: str) -> NodeReport:
        """The node called ``name`` (KeyError if none)."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def module(self, path: str) -> ModuleReport:
        """The module at ``path`` ('' is the whole model)."""
        for m in self.modules:
            if m.path == path:
                return m
        raise KeyError(path)

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form (schema ``archscan.report/1``)."""
        totals = asdict(self.totals)
        totals["arithmetic_intensity"] = self.totals.intensity
        out: dict[str, Any] = {
            "schema": self.schema,
            "model": self.model,
            "capture": self.capture,
            "capture_notes": list(self.capture_notes),
            "inputs": list(self.inputs),
            "dtype": self.dtype,
            "totals": totals,
            "nodes": [_node_json(n) for n in self.nodes],
            "modules": [_drop_none(asdict(m)) for m in self.modules],
            "uncounted": dict(self.uncounted),
            "findings": [asdict(f) for f in self.findings],
            "recommendations": [r.to_json() for r in self.recommendations],
            "warnings": list(self.warnings),
            "blocks": [dict(b) for b in self.blocks],
        }
        if self.latency is not None:
            out["latency"] = self.latency
        if self.memory is not None:
            out["memory"] = self.memory
        if self.training_step is not None:
            out["training"] = self.training_step
        if self.phases is not None:
            out["phases"], out["kv_cache"] = self.phases, self.kv_cache
        if self.parallel is not None:
            out["parallel"] = self.parallel
        if self.quant is not None:
            out["quant"] = self.quant
        return out


_FIELDS: dict[type, tuple[str, ...]] = {}
_ATOMS = (str, int, float, bool, type(None))


def asdict(obj: Any) -> Any:
    """``dataclasses.asdict``, the same result, several times faster on a report's thousands of
    records: atoms are returned as they are, not deep-copied one by one."""
    if isinstance(obj, _ATOMS):
        return obj
    cls = type(obj)
    names = _FIELDS.get(cls)
    if names is None and dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(obj))
    if names is not None:
        return {name: asdict(getattr(obj, name)) for name in names}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return cls(*[asdict(v) for v in obj])
    if isinstance(obj, (list, tuple)):
        return cls(asdict(v) for v in obj)
    if isinstance(obj, dict):
        return cls((asdict(k), asdict(v)) for k, v in obj.items()) if cls is not dict \
            else {asdict(k): asdict(v) for k, v in obj.items()}
    return copy.deepcopy(obj)


def _drop_none(d: dict) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items() if v is not None}


_NODE_FIELDS = tuple(f.name for f in dataclasses.fields(NodeReport))


def _node_json(n: NodeReport) -> dict:
    """``_drop_none(asdict(n))`` without ``asdict``'s deep copy (the fields are flat; the
    attributes are copied one level, as JSON needs): a recording has one node per op."""
    d = {}
    for name in _NODE_FIELDS:
        v = getattr(n, name)
        if v is not None:
            d[name] = list(v) if isinstance(v, tuple) else v
    d["attrs"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in n.attrs.items()}
    return d


def export_failure(report: Report) -> str | None:
    """Why torch.export failed on the model in this scan, from the capture notes ('export failed
    (why)'), or None: it worked, or was not tried. An exported graph that archscan's own run could
    not follow ('graph did not run') is no failure of export: ``archscan fuse`` still exports it."""
    for note in report.capture_notes:
        at = note.find("export failed (")
        if at < 0:
            continue
        depth, start = 0, at + len("export failed (")
        for i in range(start - 1, len(note)):
            depth += {"(": 1, ")": -1}.get(note[i], 0)
            if depth == 0:
                why = note[start:i]
                return None if why.startswith("graph did not run") else why
        return note[start:]
    return None
