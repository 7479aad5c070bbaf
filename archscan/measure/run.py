"""Measure the real model: end-to-end latency and, per graph node, its own latency.

The model is built with real (random) weights on the device, captured again the way the
static report was (fx or export; node names match), and run under ``torch.inference_mode()``.
Each node is then timed in isolation on its real inputs (warm-up, synchronisation, repeats
until the median is stable; on a GPU back to back, as the forward dispatches it: see
``timing.time_back_to_back``); the end-to-end forward is timed the same way. The per-layer sum
is reported beside the end-to-end time: the gap is launch overhead and host time between
kernels (positive when the model is overhead-bound, negative when kernels overlap).

An unstable timing (``timing.UNSTABLE_SPREAD``) is timed again with more repeats: the end to end
up to ``timing.RETRIES`` more rounds, each node once more. What stays unstable is flagged in the
latency dict (``unstable``, ``unstable_nodes``; nodes' ``latency_unstable``) and explained in
``report.warnings``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import os
import sys
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.fx

from ..load.building import Call, build_real, make_inputs
from ..capture import trace_export, trace_fx
from ..errors import ArchscanError, DeviceError
from ..load.targets import InputSpec, ModelTarget
from ..load.frames import short
from ..costs import tensors_in
from ..devices import available_bytes
from ..results import Report, module_and_ancestors
from .profile import device_name, resolve_device
from .timing import RETRIES, UNSTABLE_SPREAD, TimingStats, clock_for, summarize, time_back_to_back, time_fn, time_stable

# One more round for an unstable node: a model has hundreds, and this bounds the node phase to
# three times its usual length on a machine so busy that every node stays unstable.
NODE_RETRIES = 1


@dataclass(frozen=True)
class MeasureOptions:
    """How to measure: device, autocast dtype, memory format, CPU threads, time budgets."""

    device: str | None = None
    amp: str | None = None          # "bf16" | "fp16"
    channels_last: bool = False
    threads: int | None = None
    node_budget_ms: float = 30.0
    e2e_budget_ms: float = 1000.0
    progress: bool = True
    sweep: bool = False             # also: batch sizes x2/x4/x8; on GPU pinned vs pageable input copies
                                    # and channels_last against the default memory format


_AMP = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


class _TimingInterpreter(torch.fx.Interpreter):
    """Runs the graph once on real inputs and times every node on its own inputs."""

    def __init__(self, gm: torch.fx.GraphModule, clock, budget_ms: float, advance=None):
        super().__init__(gm, garbage_collect_values=False)
        self.clock, self.budget_ms, self.advance = clock, budget_ms, advance
        self.times: dict[str, TimingStats] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super().run_node(n)
        if n.op in ("call_function", "call_method", "call_module") and tensors_in(result):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            # in-place ops would keep changing the inputs later nodes read: time them on copies
            args, kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, _clone_unless_param, (args, kwargs))
            call = getattr(self, n.op)
            self.times[n.name] = time_back_to_back(lambda: call(n.target, args, kwargs), self.clock,
                                                   retries=NODE_RETRIES, warmup=2, min_repeats=5, budget_ms=self.budget_ms)
        if self.advance is not None:
            self.advance()
        return result


def _clone_unless_param(t: torch.Tensor) -> torch.Tensor:
    return t if isinstance(t, torch.nn.Parameter) else t.clone()


@contextlib.contextmanager
def progress_bar(total: int, enabled: bool, label: str):
    """A rich progress bar on stderr (shown when stderr is a terminal). It yields ``advance(steps=1,
    doing=None)``: ``doing`` replaces the text beside the bar (compare: the model and its phase)."""
    if not enabled or not sys.stderr.isatty():
        yield lambda steps=1, doing=None: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}"),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda steps=1, doing=None: bar.update(task, advance=steps, description=doing or label)


def check_options(options: MeasureOptions) -> tuple[torch.device, torch.dtype | None]:
    """The device and autocast dtype the options name; an error for one that is not there or not known."""
    if options.amp is not None and options.amp not in _AMP:
        raise ArchscanError(f"unknown --amp {options.amp!r}", hint="use bf16 or fp16")
    if options.threads is not None and options.threads < 1:
        raise ArchscanError(f"--threads {options.threads} is not a thread count", hint="use 1 or more")
    device = resolve_device(options.device)
    if options.threads and device.type != "cpu":
        raise ArchscanError("--threads applies to the CPU only", hint=f"drop it or measure with --device cpu, not {device}")
    return device, _AMP.get(options.amp) if options.amp else None


def measure_report(report: Report, target: ModelTarget, specs: Sequence[InputSpec], kwargs: dict,
                   dtype: torch.dtype | None, options: MeasureOptions, model: torch.nn.Module | None = None) -> Report:
    """The report with measured latency per node, per module and end to end.

    ``model``: the real model already built (an eager capture's), measured instead of building
    another (the constructor's side effects happen once).

    Raises:
        DeviceError: no such device, out of memory, or a device-side error.
    """
    device, amp = check_options(options)
    need = report.totals.param_bytes
    avail = available_bytes(device)
    if avail is not None and need > 0.9 * avail:
        raise DeviceError(f"measuring needs the real weights ({need / 2**30:.1f} GiB) but {device} has "
                          f"{avail / 2**30:.1f} GiB free", hint="measure a smaller variant or on a larger device")
    previous_threads = torch.get_num_threads()
    try:
        if device.type == "cpu" and options.threads:
            torch.set_num_threads(options.threads)
        return _measure(report, target, specs, kwargs, dtype, options, device, amp, model)
    except torch.cuda.OutOfMemoryError as exc:
        raise DeviceError(f"out of memory on {device} while measuring", hint="use a smaller --input batch") from exc
    except RuntimeError as exc:
        text = str(exc)
        if "out of memory" in text or "can't allocate memory" in text:
            raise DeviceError(f"out of memory on {device} while measuring", hint="use a smaller --input batch") from exc
        if "CUDA error" in text or "device-side" in text:
            raise DeviceError(f"device-side error on {device}: {text.splitlines()[0]}") from exc
        raise DeviceError(f"the model failed while measuring on {device}: {short(exc)}") from exc
    except ArchscanError:
        raise
    except Exception as exc:  # the static report stands; say why the measurement does not
        raise DeviceError(f"the model failed while measuring on {device}: {short(exc)}") from exc
    finally:
        torch.set_num_threads(previous_threads)


def _measure(report, target, specs, kwargs, dtype, options, device, amp, model=None) -> Report:
    model = (model if model is not None else build_real(target, kwargs, dtype, specs)).to(device)
    inputs = [x.to(device) for x in make_inputs(specs, dtype)]
    if options.channels_last:
        model = model.to(memory_format=torch.channels_last)
        inputs = [x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x for x in inputs]
    call = Call.of(specs, inputs)  # positional inputs, then the named ones by keyword
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    clock = clock_for(device)
    autocast = torch.autocast(device.type, dtype=amp) if amp is not None else contextlib.nullcontext()
    gm = None
    if report.capture == "fx":
        gm = trace_fx(model, call)
    elif report.capture == "export":
        gm = trace_export(model, call)
    with torch.inference_mode(), autocast:
        e2e = time_stable(lambda: call(model), clock, retries=RETRIES, warmup=5, min_repeats=10,
                          budget_ms=options.e2e_budget_ms)
        times: dict[str, TimingStats] = {}
        if gm is not None:
            n_nodes = len(gm.graph.nodes)
            with progress_bar(n_nodes, options.progress, f"timing {n_nodes} nodes on {device}") as advance:
                interp = _TimingInterpreter(gm, clock, options.node_budget_ms, advance)
                interp.run(*call.graph_args(gm))
            times = interp.times
            leaf_ms: dict[str, float] = {}
            unstable = [name for name, t in times.items() if t.unstable]
        else:
            leaf_ms, unstable = _leaf_module_times(model, call, clock)
        sweep = _sweep(model, specs, inputs, clock, device, options) if options.sweep else None
    nodes = tuple(dataclasses.replace(n, latency_ms=times[n.name].median_ms if n.name in times else None,
                                      attrs=_timing_attrs(n.attrs, times[n.name]) if n.name in times else n.attrs)
                  for n in report.nodes)
    by_module: dict[str, float] = dict(leaf_ms)
    for n in nodes:
        if n.latency_ms is not None:
            by_module[n.module] = by_module.get(n.module, 0.0) + n.latency_ms
    modules = _module_latency(report, by_module)
    per_layer = sum(by_module.values())  # node times, or leaf-module times for an eager capture
    batch = specs[0].shape[0] if specs and specs[0].shape else 1
    latency = {
        "device": str(device), "device_name": device_name(device),
        "measured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "amp": options.amp, "channels_last": options.channels_last,
        "cudnn_benchmark": device.type == "cuda", "inference_mode": True,
        "end_to_end_ms": e2e.median_ms, "end_to_end": e2e.to_json(),
        "throughput_per_s": batch / (e2e.median_ms / 1e3) if e2e.median_ms else None,
        "per_layer_sum_ms": per_layer if times or leaf_ms else None,
        "timed_nodes": len(times) if times else len(leaf_ms),
        "unstable": e2e.unstable, "unstable_nodes": len(unstable),
    }
    if sweep is not None:
        latency["sweep"] = sweep
    if leaf_ms:
        latency["per_layer_note"] = ("eager capture: layers timed as leaf modules inside full forward passes "
                                     f"({len(leaf_ms)} modules); their nodes carry no time of their own")
    if times or leaf_ms:
        gap = e2e.median_ms - per_layer
        latency["gap_ms"] = gap
        latency["gap_fraction"] = gap / e2e.median_ms if e2e.median_ms else 0.0
        latency["gap_explained"] = (
            "end-to-end exceeds the per-layer sum: launch overhead and host time between layers"
            if gap > 0 else "the per-layer sum exceeds end-to-end: isolated timing repeats per-call overhead "
            "that back-to-back execution overlaps")
    warnings = _instability_warnings(e2e, unstable, latency["timed_nodes"], device)
    return dataclasses.replace(report, nodes=nodes, modules=modules, latency=latency,
                               warnings=report.warnings + warnings)


def _timing_attrs(attrs: dict, stats: TimingStats) -> dict:
    """A timed node's attrs: its spread, and ``latency_unstable`` when that is over the threshold."""
    return {**attrs, "latency_spread": round(stats.spread, 4), **({"latency_unstable": True} if stats.unstable else {})}


def _instability_warnings(e2e: TimingStats, unstable: list[str], timed: int, device: torch.device) -> tuple[str, ...]:
    """What an unstable measurement means for the report, and what to do about it (nothing when stable)."""
    if not e2e.unstable and not unstable:
        return ()
    if device.type == "cpu":
        advice = (f"close other programs, pin the CPU threads with --threads (fewer than this machine's "
                  f"{os.cpu_count()} cores) and measure again")
    else:
        advice = f"stop other processes using {device} (nvidia-smi lists them) and measure again"
    names = f" ({', '.join(unstable[:3])}{', ...' if len(unstable) > 3 else ''})" if unstable else ""
    layers = f"{len(unstable)} of {timed} layer timings are unstable{names}"
    if e2e.unstable:
        return (f"the end-to-end timing is unstable: spread {100 * e2e.spread:.0f}% (quartiles {e2e.p25_ms:.3f}-"
                f"{e2e.p75_ms:.3f} ms around a median of {e2e.median_ms:.3f} ms) after {e2e.rounds} rounds, over "
                f"the {100 * UNSTABLE_SPREAD:.0f}% a quiet machine stays well under; the end-to-end time, its gap "
                f"to the per-layer sum and any prediction error against it are unreliable, and {layers}: {advice}",)
    return (f"{layers} even after a retry (spread over {100 * UNSTABLE_SPREAD:.0f}%): their ms and the per-layer "
            f"sum are unreliable (JSON: latency_unstable on those nodes); {advice}",)


def _module_latency(report: Report, ms_by_module: dict[str, float]) -> tuple:
    """Each module's latency: the sum over the modules (or nodes' modules) timed in its subtree."""
    sums: dict[str, float] = {}
    for path, ms in ms_by_module.items():
        for p in module_and_ancestors(path):
            sums[p] = sums.get(p, 0.0) + ms
    return tuple(dataclasses.replace(m, latency_ms=sums.get(m.path)) for m in report.modules)


def _leaf_module_times(model: torch.nn.Module, call: Call, clock, runs: int = 7) -> tuple[dict[str, float], list[str]]:
    """Median ms of every leaf module (no children) over ``runs`` full forward passes, via hooks,
    and the leaf modules whose samples are unstable.

    For eagerly captured models, which have no replayable graph: each leaf's forward is
    bracketed by the clock (synchronising on a GPU) while the whole model runs.
    """
    names = {id(m): n for n, m in model.named_modules() if n and not any(True for _ in m.children())}
    samples: dict[str, list[float]] = {n: [] for n in names.values()}
    started: dict[int, list] = {}

    def pre(module, args):
        if id(module) in names:
            started.setdefault(id(module), []).append(clock.start())

    def post(module, args, output):
        if id(module) in names and started.get(id(module)):
            samples[names[id(module)]].append(clock.stop(started[id(module)].pop()))

    call(model)  # warm-up
    handles = [torch.nn.modules.module.register_module_forward_pre_hook(pre),
               torch.nn.modules.module.register_module_forward_hook(post)]
    try:
        for _ in range(runs):
            call(model)
    finally:
        for h in handles:
            h.remove()
    # a module called k times per pass contributes k samples per run: its per-pass time is their sum / runs
    ms = {n: sorted(v)[len(v) // 2] * len(v) / runs for n, v in samples.items() if v}
    return ms, [n for n, v in samples.items() if v and summarize(v).unstable]


def _sweep(model, specs, inputs, clock, device: torch.device, options: MeasureOptions) -> dict:
    """Throughput at larger batches; on a GPU, input copies pinned vs pageable and channels_last A/B."""
    budget = min(options.e2e_budget_ms, 500.0)
    base = inputs[0].shape[0] if inputs and inputs[0].dim() else 1
    batches = []
    for factor in (1, 2, 4, 8):
        xs = [x.repeat(factor, *([1] * (x.dim() - 1))) if x.dim() else x for x in inputs]
        try:
            stats = time_fn(lambda: Call.of(specs, xs)(model), clock, warmup=2, min_repeats=3, budget_ms=budget)
        except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:  # out of memory, or a fixed batch size
            out_note = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            batches.append({"batch": base * factor, "failed": out_note})
            break
        batches.append({"batch": base * factor, "ms": stats.median_ms, "per_s": base * factor / (stats.median_ms / 1e3)})
        if stats.median_ms > 2000:
            break
    out: dict = {"batches": batches}
    if device.type == "cuda":
        copies = []
        for x in inputs:
            host = x.detach().cpu()
            pinned = host.pin_memory()
            pageable = time_fn(lambda: host.to(device), clock, warmup=2, min_repeats=5, budget_ms=100)
            fast = time_fn(lambda: pinned.to(device, non_blocking=True), clock, warmup=2, min_repeats=5, budget_ms=100)
            copies.append({"bytes": host.numel() * host.element_size(), "pageable_ms": pageable.median_ms,
                           "pinned_ms": fast.median_ms})
        out["input_copies"] = copies
        if not options.channels_last and any(x.dim() == 4 for x in inputs):
            cl_model = model.to(memory_format=torch.channels_last)
            cl_inputs = [x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x for x in inputs]
            cl = time_fn(lambda: Call.of(specs, cl_inputs)(cl_model), clock, warmup=3, min_repeats=5, budget_ms=budget)
            model.to(memory_format=torch.contiguous_format)
            out["channels_last_ms"] = cl.median_ms
    return out
