"""One training step on fake tensors: forward, a stand-in loss, backward, optimizer step.

The model runs as written (autocast with ``--amp``, ``torch.utils.checkpoint`` in forward,
parameters frozen in the model or with ``--freeze``) with the optimizer asked for. The optimizer
first steps once on zero gradients, which makes its state; the step analysed is then a steady
one. Nothing is allocated and nothing computed: every tensor is fake.

The loss is what a user's loop computes (``TrainOptions.loss``, ``LOSSES``): the model's own
(its ``labels`` argument given the input ids, as Hugging Face models take them), cross-entropy
over logits against integer targets, mean squared error, or the sum of every floating-point
output that requires grad. ``auto`` picks the model's own where it computes one, cross-entropy
where the output looks like logits, else the sum. The targets are data: they exist before the
forward, as a loop's batch does. The loop holds the model's output until the step ends
(``out = model(x); loss = f(out, y); loss.backward(); optimizer.step()``), unless
``release_output`` (``del out`` before backward, as a careful loop does).

Costs per phase (forward, backward, the recompute of checkpointed regions, optimizer) are
archscan's per-op formulas (the registry of ``archscan.costs``); a backward op whose result
becomes a parameter's gradient is weight-gradient work, any other input-gradient work, and a
convolution's backward is split by its output mask.
The step's memory is ``archscan.memory.MemoryTracker``'s, with ``zero_grad(set_to_none=True)``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import pickle
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn as nn
import torch.utils.checkpoint
from torch._subclasses.fake_tensor import FakeTensorMode

from ..load.building import build_fake, build_real, global_hooks_set_aside, make_call, strip_user_hooks
from ..costs import cost_op, tensors_in
from ..devices import short_of
from ..errors import ArchscanError, CaptureError, DeviceError
from ..files import write_file
from ..load.frames import short
from ..load.targets import InputSpec, ModelTarget
from ..load.recording import needs_values, output_tensors, quiet, user_line
from . import module_hooks, snapshot, summary, weights
from .scratch import nbytes
from .gpu import default_optimizer_impl, gpu_kernels
from .tracker import MemoryTracker

OPTIMIZERS = {"sgd": ("SGD", {"lr": 0.1}), "sgd-momentum": ("SGD", {"lr": 0.1, "momentum": 0.9}),
              "adam": ("Adam", {}), "adamw": ("AdamW", {})}
IMPLS = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
AMP = {"bf16": torch.bfloat16, "fp16": torch.float16}
PHASES = ("forward", "backward", "optimizer")
LOSSES = ("auto", "model", "cross-entropy", "mse", "sum")


@dataclass(frozen=True)
class TrainOptions:
    """What the step is: the optimizer (``OPTIMIZERS``), its implementation (``IMPLS``; None:
    torch's default for the device and dtype), autocast (``AMP``) and frozen parameter prefixes."""

    optimizer: str = "adamw"
    impl: str | None = None
    amp: str | None = None
    freeze: tuple[str, ...] = ()
    snapshot: str | None = None  # where to write the step as a PyTorch memory snapshot (archscan.memory.snapshot)
    checkpoint: tuple[str, ...] = ()  # module paths run under torch.utils.checkpoint (non-reentrant)
    set_to_none: bool = True          # zero_grad(set_to_none=...): False keeps the gradients between steps
    inplace: bool = False             # activation modules with an ``inplace`` switch run in place
    loss: str = "auto"                # LOSSES
    release_output: bool = False      # the loop lets the model's output go before backward (``del out``)

    @classmethod
    def parse(cls, optimizer: str | None = None, amp: str | None = None, freeze: Sequence[str] = (),
              snapshot: str | None = None, loss: str | None = None, release_output: bool = False) -> "TrainOptions":
        """From the command line's words: ``--optimizer NAME[:IMPL]``, ``--amp``, ``--freeze``,
        ``--loss``, ``--release-output`` (checked)."""
        if loss is not None and loss not in LOSSES:
            raise ArchscanError(f"unknown --loss {loss!r}", hint=f"use one of: {', '.join(LOSSES)}")
        name, _, impl = (optimizer or "adamw").partition(":")
        if name not in OPTIMIZERS:
            raise ArchscanError(f"unknown optimizer {name!r}", hint=f"use one of: {', '.join(OPTIMIZERS)} (NAME[:IMPL])")
        if impl and impl not in IMPLS:
            raise ArchscanError(f"unknown optimizer implementation {impl!r}", hint=f"use one of: {', '.join(IMPLS)}")
        if amp is not None and amp not in AMP:
            raise ArchscanError(f"unknown --amp {amp!r}", hint=f"use one of: {', '.join(AMP)}")
        return cls(name, impl or None, amp, tuple(freeze), snapshot, loss=loss or "auto", release_output=release_output)

    def to_json(self) -> dict:
        return {"optimizer": self.optimizer, "impl": self.impl or "default", "amp": self.amp, "freeze": list(self.freeze),
                **({"snapshot": self.snapshot} if self.snapshot else {}),
                **({"checkpoint": list(self.checkpoint)} if self.checkpoint else {}),
                **({"inplace": True} if self.inplace else {}),
                "loss": self.loss, "output": "released before backward" if self.release_output else "held until the step ends",
                "zero_grad": f"set_to_none={self.set_to_none}"}


class _StepTracker(MemoryTracker):
    """The memory tracker that also costs every op of the step into its phase and module: the
    module a forward op ran in, or the module of the forward op a backward op answers (one mode,
    not two stacked: each mode a fake op passes through costs time on a 70B step)."""

    def __init__(self):
        super().__init__(locate=user_line)
        self.rows: list[tuple] = []  # (phase, module, flops, mac_bytes, serials of the results, input share)
        self.forward_of: dict[int, str] = {}  # autograd node sequence number -> module path of the op that made it
        self.uncounted: dict[str, dict[str, int]] = {p: {} for p in (*PHASES, "recompute")}  # ops with no formula
        self.saved: dict[str, int] = {}  # module path -> bytes it keeps for the backward
        self.outputs: dict[str, set[int]] = {}  # module path -> serials of the storages it returned in forward
        self.saved_outputs: dict[str, int] = {}  # module path -> bytes of its outputs still held for the backward
        # phase -> (op, category, dtype) -> [ops, multiply-adds, executed multiply-adds, bytes]: what a GPU's time needs
        self.op_classes: dict[str, dict[tuple, list[int]]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace in ("prim", "profiler"):  # metadata queries; record_function markers
            return func(*args, **kwargs)
        step_phase = phase = self.phase
        if phase == "backward":
            node = torch._C._current_autograd_node()
            if node is not None:
                self.where = self.forward_of.get(node._sequence_nr(), "")
            if _in_forward_of_backward():  # checkpoint recomputes its forward inside backward
                phase = self.phase = "recompute"
        try:
            out = super().__torch_dispatch__(func, types, args, kwargs)
        finally:
            self.phase = step_phase
        if out is NotImplemented or self.paused:  # a DTensor's op: its local ops are costed as they come back
            return out
        cost = cost_op(func, args, kwargs, out)
        if not cost.counted:
            self.uncounted[phase][cost.op] = self.uncounted[phase].get(cost.op, 0) + 1
        live = self.live
        serials = [live[k].serial for k in (t.untyped_storage()._cdata for t in tensors_in(out)) if k in live]
        split = None  # a backward op's (multiply-adds, bytes) of the input gradient (decided later for the rest)
        mac = cost.mac_bytes
        if func.overloadpacket is torch.ops.aten.convolution_backward:
            split, mac = _convolution_backward_split(args, kwargs, out, cost.flops)
        elif func.overloadpacket in _RNN_BACKWARDS:  # one kernel for both gradients: half its work is the
            split = (cost.flops // 2, mac // 2)  # input and state gradients' (the gate gradient times each weight)
        elif phase != "backward":
            split = (cost.flops, mac)
        module = self.where if isinstance(self.where, str) else ""
        self.rows.append((phase, module, cost.flops, mac, serials, split))
        outs = tensors_in(out)
        sums = self.op_classes.setdefault(phase, {}).setdefault(
            (cost.op, backward_category(func, args, cost.category), str(outs[0].dtype).removeprefix("torch.") if outs else None),
            [0, 0, 0, 0])
        executed = cost.attrs.get("executed_flops", cost.flops) if cost.attrs.get("causal") else cost.flops
        for i, v in enumerate((1, cost.flops, executed, mac)):
            sums[i] += v
        return out


def _in_forward_of_backward() -> bool:
    """Is a checkpointed forward being recomputed (autograd is recording inside backward)?"""
    return torch.is_grad_enabled() and torch._C._current_autograd_node() is not None


def train_step(target: ModelTarget, specs: Sequence[InputSpec], options: TrainOptions, kwargs: dict | None = None,
               dtype: torch.dtype | None = None, model: nn.Module | None = None) -> dict:
    """Analyse one steady-state training step (see the module docstring): the JSON ``training``
    section, with the step's ``memory``. A step that needs tensor values (``.item()`` in forward, a
    value-dependent branch) runs for real instead, on seeded random inputs and weights, after a
    check that it fits in the memory that is free; ``basis`` says which. ``model``: the fake model
    to step (``fake_model``), left as it was found, for several steps of one model."""
    check_trainable(target)
    if model is None:
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        model = build_fake(target, kwargs or {}, dtype, fake_mode, specs)
    else:
        fake_mode = next(t.fake_mode for t in model.parameters())
    try:
        with _restored(model):
            tracker, grads = _analysed_step(model, make_call(specs, dtype, fake_mode), options, fake_mode, target,
                                            "on fake tensors")
        basis = "fake tensors"
    except CaptureError as exc:
        if not needs_values(exc.__cause__):
            raise
        _check_real_step_fits(model, specs, exc)
        real = build_real(target, kwargs or {}, dtype, specs)
        tracker, grads = _analysed_step(real, make_call(specs, dtype), options, contextlib.nullcontext(), target,
                                        "for real")
        basis = f"a real run on seeded random inputs ({short(exc.__cause__)} on fake tensors)"
    if options.snapshot:
        _write_snapshot(snapshot(tracker), options.snapshot)
    return {"options": options.to_json(), "basis": basis, "loss": tracker.loss,
            **({"cache_off": True} if options.checkpoint and caches_in_forward(model) else {}),
            **_costs(tracker, grad_keys=tracker.serials_of(grads)),
            "memory": summary(tracker)}


def fake_model(target: ModelTarget, specs: Sequence[InputSpec], kwargs: dict | None = None,
               dtype: torch.dtype | None = None) -> nn.Module:
    """The model on fake tensors, for ``train_step(..., model=)``."""
    return build_fake(target, kwargs or {}, dtype, FakeTensorMode(allow_non_fake_inputs=True), specs)


@contextlib.contextmanager
def _restored(model: nn.Module):
    """Leave the model as the step found it: which parameters require grad, no gradients, the
    modules' own forwards (not checkpointed) and their ``inplace`` switches."""
    grads = {p: p.requires_grad for p in model.parameters()}
    inplace = {m: m.inplace for m in model.modules() if isinstance(getattr(m, "inplace", None), bool)}
    forwards = {m: m.__dict__["forward"] for m in model.modules() if "forward" in m.__dict__}
    caches = caches_in_forward(model)
    try:
        yield
    finally:
        if caches:
            model.config.use_cache = True
        for p, flag in grads.items():
            p.requires_grad_(flag)
            p.grad = None
        for m, flag in inplace.items():
            m.inplace = flag
        for m in model.modules():
            if m in forwards:
                m.forward = forwards[m]
            else:
                m.__dict__.pop("forward", None)


def _analysed_step(model: nn.Module, call, options: TrainOptions, base, target: ModelTarget, how: str,
                   tracker: "_StepTracker | None" = None, runtime=contextlib.nullcontext) -> tuple:
    """The tracked steady-state step of ``model`` under ``base`` (a fake mode, or nothing for a real
    run, ``how`` says which): the settled tracker and the gradients. Raises ``CaptureError`` (its
    cause the model's exception) when the step fails. ``tracker``: a ``_StepTracker`` of the
    caller's (``archscan.parallel``'s records collectives); ``runtime(tracker)``: a context the
    step runs in, around the tracker."""
    model.train()
    strip_user_hooks(model)  # the analysis is of forward itself (archscan.capture)
    _freeze(model, options.freeze)
    _checkpoint(model, options.checkpoint)
    if options.inplace:
        for m in model.modules():
            if isinstance(getattr(m, "inplace", None), bool):
                m.inplace = True
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ArchscanError(f"{target.name} has no trainable parameter" + (" left after --freeze" if options.freeze else ""),
                            hint="a training step needs a parameter that requires grad")
    optimizer = _optimizer(params, options)
    tracker = tracker if tracker is not None else _StepTracker()
    tracker.frozen = {path for path, m in model.named_modules()
                      if any(True for _ in m.parameters(recurse=False)) and not any(p.requires_grad for p in m.parameters(recurse=False))}

    def claim(path: str, output: Any) -> None:
        if tracker.phase == "forward" and torch.is_grad_enabled():
            _claim(tracker.forward_of, output, path)
            tracker.outputs.setdefault(path, set()).update(tracker.serials_of(output_tensors(output)))

    hooks = module_hooks(model, tracker, claim)
    try:
        with global_hooks_set_aside(), base, quiet():
            _warm(optimizer, params)  # the optimizer's state exists after it: the step below is a steady one
            if not options.set_to_none:  # the gradients stay allocated between steps
                for p in params:
                    p.grad = torch.zeros_like(p)
            plan = _loss_plan(model, call, options)
            tracker.register(*weights(model))
            tracker.register([p.grad for p in params if p.grad is not None], "grads")
            tracker.register(plan.call.tensors() + ([plan.targets] if plan.targets is not None else []), "inputs")
            tensors, _, modules = weights(model)
            owner = {id(p): m for p, m in zip(tensors, modules)}
            state = [(v, owner.get(id(p))) for p, s in optimizer.state.items() for v in s.values()
                     if isinstance(v, torch.Tensor)]
            tracker.register([v for v, _ in state], "optimizer_state", [m for _, m in state])
            tracker.peak.bytes = tracker.bytes
            with runtime(tracker), tracker, gpu_kernels():
                grads = _step(model, call, optimizer, options, tracker, plan)
    except ArchscanError:
        raise
    except Exception as exc:
        raise CaptureError(f"the training step of {target.name} did not run {how}: {short(exc)}",
                           hint="`archscan MODEL` (without --train) shows whether its forward runs") from exc
    finally:
        for h in hooks:
            h.remove()
    tracker.settle(grads)
    tracker.close()
    return tracker, grads


def _check_real_step_fits(model: nn.Module, specs: Sequence[InputSpec], exc: BaseException) -> None:
    """A real step holds the weights, their gradients and up to two optimizer moments, and the
    inputs: fail with one line, before allocating, when that would not fit in half the free memory."""
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    need = 4 * weights + sum(math.prod(s.shape) * s.dtype.itemsize for s in specs)
    free = short_of(need)
    if free is not None:
        raise DeviceError(f"the training step needs tensor values ({short(exc.__cause__)}), so it would run for real, "
                          f"but its weights, gradients and optimizer state alone need {need / 2**30:.1f} GiB and "
                          f"{free / 2**30:.1f} GiB is free", hint="make the model's forward traceable without values")


def check_trainable(target: ModelTarget) -> None:
    """Before any analysis: a training step needs the model's own modules."""
    if target.program:
        raise ArchscanError(f"{target.name} is an exported program: its graph was traced for inference, not training",
                            hint="point --train at the model's source: file.py:Net, package.module:factory or zoo:name")


def _warm(optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> None:
    """One optimizer step on zero gradients: it makes the state a first training step makes (a
    forward and backward would only give the gradients other values). The step is taken by the
    same optimizer's foreach implementation, whose state is the same tensors (one op per kind of
    update instead of one per parameter: 723 parameters of a 70B model), and its state handed over."""
    for p in params:
        p.grad = torch.zeros_like(p)
    try:
        warm = type(optimizer)(params, **{**optimizer.defaults, "foreach": True, "fused": None})
    except (TypeError, ValueError, RuntimeError):
        warm = optimizer
    warm.step()
    if warm is not optimizer:
        optimizer.state.update(warm.state)
    optimizer.zero_grad(set_to_none=True)


def under(name: str, prefix: str) -> bool:
    """Is the parameter ``name`` under the module path ``prefix`` (``--freeze``'s rule)?"""
    return name == prefix or name.startswith(prefix.rstrip(".") + ".")


def _freeze(model: nn.Module, prefixes: Sequence[str]) -> None:
    for prefix in prefixes:
        hit = [p for name, p in model.named_parameters() if under(name, prefix)]
        if not hit:
            raise ArchscanError(f"--freeze {prefix} matches no parameter",
                                hint="give a module path prefix, as `archscan MODEL` lists them (e.g. --freeze layer1)")
        for p in hit:
            p.requires_grad_(False)


def caches_in_forward(model: nn.Module) -> bool:
    """Does the model make a KV cache in every forward (a Hugging Face decoder's ``config.use_cache``,
    on by default)? A checkpointed layer would then fill it again in its recompute, and the
    recomputed keys no longer match the saved ones: transformers' own gradient checkpointing
    turns the cache off for that reason, and so do archscan's plans (``_checkpoint``)."""
    return getattr(getattr(model, "config", None), "use_cache", None) is True


def _checkpoint(model: nn.Module, paths: Sequence[str]) -> None:
    """Run each module at ``paths`` under ``torch.utils.checkpoint.checkpoint`` (non-reentrant), as
    ``archscan.memory.budget.checkpoint_code`` prints it, with the model's cache off
    (``caches_in_forward``; ``_restored`` turns it back on)."""
    if paths and caches_in_forward(model):
        model.config.use_cache = False
    for path in paths:
        try:
            module = model.get_submodule(path)
        except AttributeError:
            raise ArchscanError(f"no module {path!r} to checkpoint", hint="give module paths as `archscan MODEL` lists them") from None
        module.forward = functools.partial(torch.utils.checkpoint.checkpoint, module.forward, use_reentrant=False)


def _optimizer(params: list[nn.Parameter], options: TrainOptions) -> torch.optim.Optimizer:
    cls_name, defaults = OPTIMIZERS[options.optimizer]
    impl = IMPLS[options.impl] if options.impl else default_optimizer_impl()
    if impl.get("fused") and not all(p.is_floating_point() for p in params):
        raise ArchscanError(f"torch has no fused {options.optimizer} for these parameters", hint="use :foreach or :for-loop")
    try:
        return getattr(torch.optim, cls_name)(params, **defaults, **impl)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise ArchscanError(f"torch cannot make {options.optimizer}:{options.impl} here: {short(exc)}",
                            hint="use :foreach or :for-loop") from None


def _claim(forward_of: dict[int, str], output: Any, path: str) -> None:
    stack = [t.grad_fn for t in output_tensors(output) if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        nr = node._sequence_nr()
        if nr in forward_of:
            continue
        forward_of[nr] = path
        stack.extend(n for n, _ in node.next_functions if n is not None)


_RNN_BACKWARDS = frozenset(op for op in (getattr(torch.ops.aten, name, None) for name in
                                         ("mkldnn_rnn_layer_backward", "_cudnn_rnn_backward", "miopen_rnn_backward"))
                           if op is not None)


def _convolution_backward_split(args, kwargs, out, flops: int) -> tuple[tuple[int, int], int]:
    """A convolution's backward runs one kernel per gradient: the input gradient's reads
    grad_output and the weight and writes the input gradient, the weight gradient's reads
    grad_output and the input and writes the weight and bias gradients; each costs the forward's
    multiply-adds. Returns the input gradient's (multiply-adds, bytes) and both kernels' bytes."""
    grad_output, x, weight = args[:3]
    mask = args[10] if len(args) > 10 else kwargs.get("output_mask", (True, True, True))
    grad_input, grad_weight, grad_bias = (tuple(out) + (None, None, None))[:3]
    to_input = (nbytes(grad_output) + nbytes(weight) + nbytes(grad_input)) if mask[0] else 0
    to_weight = (nbytes(grad_output) + nbytes(x) + nbytes(grad_weight) + nbytes(grad_bias)
                 if (mask[1] or mask[2]) else 0)
    kernels = int(bool(mask[0])) + int(bool(mask[1]))
    return (flops * bool(mask[0]) // max(kernels, 1), to_input), to_input + to_weight


@dataclass
class _Loss:
    """The loss a step computes (``_loss_plan``): its kind, the model's call (with ``labels`` for
    the model's own), the targets made before the forward (a guess of their shape for
    cross-entropy and mean squared error, made again after the forward where it was wrong), and
    how it was chosen."""

    kind: str                          # LOSSES, "auto" until the output is seen
    call: Any
    targets: torch.Tensor | None
    why: str


def _loss_plan(model: nn.Module, call, options: TrainOptions) -> _Loss:
    """The loss ``options.loss`` asks for, and its data, made now (under the step's fake mode)."""
    kind = options.loss
    try:
        params = set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        params = set()
    tokens = next((t for t in call.tensors() if t.dim() == 2 and not t.is_floating_point() and t.dtype != torch.bool),
                  None)  # [batch, tokens] ids: a language model's input, its targets' shape and values
    given = "labels" in call.kwargs
    why = "asked for (--loss)"
    if kind == "auto" and (given or ("labels" in params and tokens is not None)):
        kind, why = "model", "the model computes its own loss (it takes labels)"
    if kind == "model":
        if not given:
            if "labels" not in params:
                raise ArchscanError(f"--loss model: {type(model).__name__}.forward takes no labels argument",
                                    hint="use --loss cross-entropy, mse or sum, or pass the labels: --input labels=...")
            if tokens is None:
                raise ArchscanError("--loss model: no integer input of shape [batch, tokens] to give as labels",
                                    hint="pass the labels: --input labels=SHAPE:int64")
            call = type(call)(call.args, {**call.kwargs, "labels": tokens.clone()})
        return _Loss("model", call, None, why)
    first = next(iter(call.tensors()), None)
    targets = None
    if kind in ("auto", "cross-entropy"):  # classes of [N, C] logits, or the next tokens of [N, T, V] ones
        targets = tokens.clone() if tokens is not None else \
            torch.zeros(first.shape[:1] if first is not None and first.dim() else (1,), dtype=torch.long)
    elif kind == "mse" and first is not None and first.is_floating_point():
        targets = torch.zeros_like(first)  # an autoencoder's, a denoiser's target: shaped as its input
    return _Loss(kind, call, targets, why)


def _looks_like_logits(out: torch.Tensor, targets: torch.Tensor | None) -> bool:
    """Class scores: [N, C], or [N, T, V] over a language model's tokens."""
    return out.dim() == 2 or (out.dim() == 3 and targets is not None and targets.dim() == 2
                              and tuple(targets.shape) == tuple(out.shape[:2]))


def _loss_of(output: Any, outs: list[torch.Tensor], plan: _Loss, tracker: MemoryTracker) -> torch.Tensor:
    """The loss ``plan`` says, from the model's output; ``plan.kind`` resolved where it was "auto"."""
    if plan.kind == "model":
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if loss is None and isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor) \
                and output[0].dim() == 0:
            loss = output[0]
        if not isinstance(loss, torch.Tensor):
            raise ArchscanError("--loss model: the model was given labels but returned no loss",
                                hint="use --loss cross-entropy, mse or sum")
        return loss
    first = outs[0]
    if plan.kind == "auto":
        plan.kind, plan.why = (("cross-entropy", "the output looks like logits") if _looks_like_logits(first, plan.targets)
                               else ("sum", "the output does not look like logits"))
    if plan.kind == "cross-entropy":
        want = tuple(first.shape[:2]) if first.dim() == 3 and _looks_like_logits(first, plan.targets) \
            else (first.shape[0], *first.shape[2:])
        _remake_targets(plan, want, torch.long, tracker)
        if first.dim() == 3 and tuple(plan.targets.shape) == tuple(first.shape[:2]):  # next tokens over a vocabulary
            return torch.nn.functional.cross_entropy(first.flatten(0, 1), plan.targets.flatten())
        return torch.nn.functional.cross_entropy(first, plan.targets)
    if plan.kind == "mse":
        _remake_targets(plan, tuple(first.shape), first.dtype, tracker)
        return torch.nn.functional.mse_loss(first, plan.targets)
    _remake_targets(plan, None, None, tracker)  # a guess auto made and did not use: gone before the loss
    loss = outs[0].sum()
    for t in outs[1:]:
        loss = loss + t.sum()
    return loss


def _remake_targets(plan: _Loss, shape, dtype, tracker: MemoryTracker) -> None:
    """Targets of ``shape`` (None: none), made again where the guess made before the forward was
    wrong: as data, outside the step's ops."""
    if shape is None:
        plan.targets = None
        return
    if plan.targets is not None and tuple(plan.targets.shape) == tuple(shape) and plan.targets.dtype == dtype:
        return
    device = next((t.device for t in plan.call.tensors()), None)
    tracker.paused = True
    try:
        plan.targets = torch.zeros(shape, dtype=dtype, device=device)
    finally:
        tracker.paused = False
    tracker.register([plan.targets], "inputs")


def _step(model, call, optimizer, options: TrainOptions, tracker: MemoryTracker, plan: _Loss | None = None) -> list:
    """forward, loss, backward, optimizer step, zero_grad(set_to_none=True); the gradients it made.
    The loop holds the model's output until the step ends unless ``options.release_output``."""
    def phase(name: str) -> None:
        tracker.phase = name
        tracker.where = ""

    plan = plan if plan is not None else _Loss("sum", call, None, "asked for (--loss)")
    phase("forward")
    amp = torch.autocast("cpu", dtype=AMP[options.amp]) if options.amp else contextlib.nullcontext()
    with amp:
        output = plan.call(model)
        outs = [t for t in output_tensors(output) if t.is_floating_point() and t.requires_grad]
        if not outs:
            raise ArchscanError("no floating-point output of the model requires grad: there is nothing to train",
                                hint="the model's output must depend on a parameter that requires grad")
        loss = _loss_of(output, outs, plan, tracker)
    tracker.loss = {"kind": plan.kind, "why": plan.why,
                    **({"targets": {"shape": list(plan.targets.shape), "dtype": str(plan.targets.dtype).replace("torch.", "")}}
                       if plan.targets is not None else {}),
                    "output": "released before backward" if options.release_output else "held until the step ends"}
    del outs
    if options.release_output:
        del output
    tracker.saved = _saved_by_module(tracker, loss)
    phase("backward")
    loss.backward()
    del loss
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    tracker.mark_grads(grads)
    phase("optimizer")
    optimizer.step()
    optimizer.zero_grad(set_to_none=options.set_to_none)
    return grads


def _saved_by_module(tracker: MemoryTracker, loss: torch.Tensor) -> dict[str, int]:
    """Bytes each module keeps for the backward: what its forward made that is still live when the
    backward starts (the autograd graph holds it; the outputs are released by then, the loss is not
    counted)."""
    saved: dict[str, int] = {}
    loss_key = loss.untyped_storage()._cdata
    held = {}
    for key, record in tracker.live.items():
        if record.phase == "forward" and key != loss_key:
            module = record.where if isinstance(record.where, str) else ""
            saved[module] = saved.get(module, 0) + record.nbytes
            held[record.serial] = record.nbytes
    outputs = getattr(tracker, "outputs", {})
    tracker.saved_outputs = {path: sum(held.get(s, 0) for s in serials) for path, serials in outputs.items()}
    return dict(sorted(saved.items(), key=lambda kv: -kv[1]))


def _costs(tracker: _StepTracker, grad_keys: set[int]) -> dict:
    """Per phase and per module: multiply-adds and bytes, backward split into input and weight
    gradients, and the backward/forward ratio."""
    phases = {p: {"flops": 0, "mac_bytes": 0, "ops": 0} for p in (*PHASES, "recompute")}
    split = {"input_grad_flops": 0, "weight_grad_flops": 0, "input_grad_bytes": 0, "weight_grad_bytes": 0}
    modules: dict[str, dict] = {}
    parts = ("forward", "input_grad", "weight_grad", "recompute", "optimizer")
    for phase, module, flops, mac, keys, to_input in tracker.rows:
        row = phases[phase]
        row["flops"] += flops
        row["mac_bytes"] += mac
        row["ops"] += 1
        per = modules.setdefault(module, {**{p: 0 for p in parts}, "bytes": {p: 0 for p in parts}})
        if phase == "backward":
            if to_input is None:  # an op that makes a weight's gradient is the weight gradient's
                to_input = (0, 0) if any(k in grad_keys for k in keys) else (flops, mac)
            for grad, f, b in (("input_grad", *to_input), ("weight_grad", flops - to_input[0], mac - to_input[1])):
                split[f"{grad}_flops"] += f
                split[f"{grad}_bytes"] += b
                per[grad] += f
                per["bytes"][grad] += b
        else:
            per[phase] += flops
            per["bytes"][phase] += mac
    forward = phases["forward"]["flops"]
    return {"phases": phases, "backward": split, "modules": modules,
            "backward_forward_why": _why_not_two(modules, phases, getattr(tracker, "frozen", set()),
                                                 tracker.op_classes, tracker.uncounted.get("backward", {})),
            "saved_for_backward": tracker.saved,
            "saved_outputs": {p: b for p, b in tracker.saved_outputs.items() if b},
            "phase_peaks": dict(tracker.phase_peaks),
            "uncounted": {phase: ops for phase, ops in tracker.uncounted.items() if ops},
            "op_classes": {phase: [{"op": op, "category": category, "dtype": dtype, "ops": n, "flops": f,
                                    "executed_flops": e, "mac_bytes": b}
                                   for (op, category, dtype), (n, f, e, b) in sorted(rows.items(), key=lambda kv: -kv[1][3])]
                           for phase, rows in tracker.op_classes.items()},
            "backward_forward_ratio": phases["backward"]["flops"] / forward if forward else None}


def backward_category(func, args, category: str) -> str:
    """A convolution's backward filed by its groups, as its forward is (``conv``, ``depthwise_conv``,
    ``grouped_conv``: their kernels differ, cuDNN's depthwise backward most); ``category`` otherwise."""
    if func.overloadpacket is not torch.ops.aten.convolution_backward:
        return category
    # convolution_backward(grad_output [N, Cout, ...], input [N, Cin, ...], weight, bias_sizes, stride, padding,
    # dilation, transposed, output_padding, groups, output_mask)
    groups, channels = int(args[9]), int(args[1].shape[1])
    return "conv" if groups == 1 else "depthwise_conv" if groups == channels else "grouped_conv"


def _why_not_two(modules: dict, phases: dict, frozen: set[str], op_classes: dict | None = None,
                 uncounted: dict | None = None) -> list[dict]:
    """Why the backward is not twice the forward, in multiply-adds against 2 × forward: layers that
    need no input gradient (the first layer: its input needs none), frozen layers (no weight
    gradient), and the rest: the op categories whose backward is not twice their forward (from
    ``op_classes``), and the backward ops no formula counts (``uncounted``: they count 0), named
    as they are; where neither tells, it says so. The items add up to backward − 2 × forward."""
    why, explained = [], 0
    no_input = {m: v["forward"] for m, v in modules.items()
                if v["forward"] and not v["input_grad"] and (v["weight_grad"] or m in frozen)}
    no_weight = {m: v["forward"] for m, v in modules.items() if v["forward"] and m in frozen and not v["weight_grad"]}
    for reason, found in (("no input gradient", no_input), ("frozen: no weight gradient", no_weight)):
        if found:
            flops = -sum(found.values())
            why.append({"reason": reason, "flops": flops, "modules": sorted(found, key=lambda m: -found[m])})
            explained += flops
    rest = phases["backward"]["flops"] - 2 * phases["forward"]["flops"] - explained
    if rest:
        why.append({"reason": _rest_reason(op_classes or {}, uncounted or {}), "flops": rest, "modules": []})
    return why


def _rest_reason(op_classes: dict, uncounted: dict) -> str:
    by: dict[str, list[int]] = {}
    for phase, scale in (("forward", -2), ("backward", 1)):
        for (op, category, dtype), (n, flops, *_) in op_classes.get(phase, {}).items():
            by.setdefault(category, [0])[0] += scale * flops
    off = sorted(((c, d[0]) for c, d in by.items() if d[0]), key=lambda kv: -abs(kv[1]))[:3]
    parts = []
    if off:
        parts.append("categories whose backward is not 2 × forward: " + ", ".join(c for c, _ in off))
    if uncounted:
        parts.append("backward ops no formula counts (0 here): "
                     + ", ".join(f"{op} ×{n}" for op, n in sorted(uncounted.items(), key=lambda kv: -kv[1])[:4]))
    return "other ops: " + ("; ".join(parts) if parts else "not broken down")


def _write_snapshot(data: dict, path: str) -> None:
    write_file(path, pickle.dumps(data), "--memory-snapshot")
