"""The orchestrator: ``archscan.scan`` and ``archscan.fuse``, the library entry points the CLI is a thin face over.

``scan`` runs the analysis core (``archscan.analysis``: load, capture, cost, graph), then the
measurement and predictions (``archscan.measure``), then the rules (they read the measurements)
and the recommendations that answer them (``archscan.recommend``). It stands on every stage and
none stands on it: the transforms, prune, distill and compare call the core's ``analyse``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import torch
import torch.nn as nn

from .analysis import analysis, check_rules
from .capture import collector_paused, seeded_rng
from .errors import ArchscanError, CaptureError, DeviceError
from .load.frames import exit_error
from .isolation import isolated
from .load.building import on_meta, with_build
from .load.targets import InputLike, check_kwargs, input_specs, model_dtype, to_target
from .memory.gpu import CPU, Execution, execution_for, executing, limited, of_device, of_gpu
from .memory.train import TrainOptions, check_trainable, train_step
from .parallel import ParallelSpec
from .measure import DeviceProfile, MeasureOptions, apply_predictions, cached_profile, check_options, measure_report, resolve_device
from .measure.predict import with_training_time
from .recommend import recommend as _recommend
from .results import Report
from .units import fmt_bytes
from .rules import select_rules


@isolated
def scan(model: nn.Module | Callable[..., nn.Module] | str, inputs: Sequence[InputLike] | InputLike,
         *, kwargs: dict | None = None, dtype: torch.dtype | str | None = None, capture_method: str = "auto",
         name: str | None = None, rules: Sequence[str] | None = None,
         measure: MeasureOptions | bool | None = None, profile: DeviceProfile | bool | None = None,
         recommend: bool = True, train: TrainOptions | bool | None = None,
         memory: str | int | None = None, what_ifs: bool = False, decode: int | None = None,
         decode_on: Sequence[DeviceProfile] = (), allow_pickle: bool = False,
         execution: str | None = None, parallel: "str | ParallelSpec | None" = None,
         plan: str | Callable | None = None, interconnect: str | None = None, quant: str | None = None,
         kv: str | None = None, keep: Sequence[str] = ()) -> Report:
    """Analyse a model: params, FLOPs (multiply-adds) and memory access cost per layer.

    Safe to call from several threads: calls take turns on one process-wide lock, and the
    caller's torch state (grad mode, default device and dtype, deterministic and TF32 flags...)
    is given back as it was (``archscan.isolation``).

    Args:
        model: an ``nn.Module`` instance, a module class or factory, or a target string
            ('file.py:Net', 'pkg.mod:factory', 'zoo:resnet50').
        inputs: one input or a list of them: shapes (``(1, 3, 224, 224)``), specs
            (``'1,128:int64'``, ``'attention_mask=1,128:int64'`` for a keyword argument) or example
            tensors (only their shape and dtype are used); or a dict of keyword arguments.
        kwargs: constructor arguments when ``model`` is a class, factory or target string.
        dtype: run the model in this dtype (e.g. ``torch.bfloat16`` or ``'bf16'``).
        capture_method: ``'auto'`` (fx, then the recording on fake tensors, then export; see
            ``archscan.capture.capture``) or one of them.
        name: the model's name in the report.
        rules: rule ids to check (``archscan.rules.RULES``); None checks all, ``[]`` none.
        measure: time the real model (``True`` or ``MeasureOptions``: device, amp, channels_last...).
        profile: a ``DeviceProfile`` for roofline predictions; None uses the cached profile of the
            device (``archscan calibrate``) when there is one; False predicts nothing.
        recommend: rank the changes that answer the findings (``report.recommendations``).
        train: also analyse one training step (``True`` or ``archscan.memory.train.TrainOptions``:
            optimizer and implementation, autocast, frozen prefixes): ``report.training_step``.
        memory: a memory budget ('80GiB', '24GB', a GPU name such as 'h100', or bytes; measuring on
            a GPU, its memory when not given): the largest batch whose peak fits (the training
            step's with ``train``), and with ``train`` an
            activation-checkpointing plan (``report.memory["budget"]``, ``["checkpoint_plan"]``;
            ``archscan.memory.budget``).
        decode: the context length L of a KV cache: ``inputs`` are then the new tokens of one decode
            step after L cached ones (``archscan.llm.decode``): ``report.phases`` (prefill of L tokens,
            the decode step) and ``report.kv_cache``, predicted on ``profile`` when there is one;
            with a datasheet profile (a named GPU), also over a batch × context grid.
        decode_on: more ``DeviceProfile``s the decode step is predicted on
            (``report.phases["decode"]["on"]``; ``archscan compare --device-profile h100,h200``).
        what_ifs: with ``train``: the step re-analysed with one change each (bf16 autocast, bf16
            parameters, each optimizer implementation, ``zero_grad(set_to_none=False)``, a frozen
            half, gradient accumulation, in-place activations): ``report.memory["what_ifs"]``.
        allow_pickle: a ``.pt2`` target may run code pickled inside it while it loads; without it
            such a file is refused (``archscan.load.targets._load_program``). Only for files you trust.
        execution: whose kernels the memory is counted for: 'cpu' or a GPU's name ('h100'); None
            chooses from the question: a GPU measured on or predicted on (``profile``), or a GPU
            named as the budget (``memory='h100'``), else the CPU (``archscan.memory.gpu``).
        parallel: with ``train``, the step spread over a mesh of GPUs (``'fsdp=8'``, ``'fsdp=8,tp=8'``,
            ``'dp=2,fsdp=4'``, ``'ddp=4'``, ``'tp=4'``; ``'auto:64'`` searches the meshes of 64 GPUs that
            fit ``memory``): ``inputs`` are one rank's micro-batch; ``report.parallel`` holds rank 0's
            peak and its breakdown, the collectives, and with a GPU (``profile`` or ``memory``) the
            step's time; with ``memory`` the largest micro-batch per rank (``archscan.parallel``).
            The single-device step is not analysed then.
        plan: with ``parallel``, the user's parallelize function (or ``'file.py:function'``), called
            as ``function(model, mesh)`` on the meta device, doing all of the sharding itself.
        interconnect: with ``parallel``, the interconnect collectives are timed on
            (``archscan.parallel.comm.INTERCONNECTS``); default: the GPU's own NVLink node.
        quant: analyse the model quantized with torchao (``'int8'``, ``'w8a8'``, ``'fp8'``, ``'int4'``,
            ``'int4:g32'``; ``archscan.quant``): ``report.quant`` holds each linear layer quantized or
            kept and why, its bytes as stored, and the totals and predicted time before and after
            (with ``decode``, the decode step's tokens/s too). Needs torchao (``archscan[quant]``).
        kv: with ``decode``, the KV cache quantized too (``'int8'`` or ``'fp8'``: one byte an element).
        keep: with ``quant``, layers that stay in high precision (module paths, prefixes or regular
            expressions).

    Returns:
        A frozen ``Report``; ``report.to_json()`` is the ``--json`` output.
    """
    dtype = model_dtype(dtype)
    specs = input_specs(inputs, dtype)
    options = MeasureOptions() if measure is True else measure or None
    if options is not None:
        device = check_options(options)[0]  # a device that is not there fails now, not after the analysis
        if memory is None and device.type == "cuda":  # measuring on a GPU: the batch that fills its memory
            memory = torch.cuda.get_device_properties(device).total_memory
    target = to_target(model, name, allow_pickle)
    check_kwargs(target, kwargs)
    selected = select_rules() if rules is None else select_rules(rules) if rules else []
    train = TrainOptions() if train is True else train or None
    if train is not None:
        check_trainable(target)
    budget = _budget(memory, specs)
    if decode is not None:
        from .llm.decode import check_decode

        check_decode(specs, decode)
    if what_ifs and train is None:
        raise ArchscanError("what-ifs change the training step", hint="add --train (train=True)")
    spread = _parallel(parallel, plan, interconnect, train, what_ifs, decode, budget)
    quantize = _quant_options(quant, kv, keep, decode, spread, train)
    runs_as = _execution(execution, profile, memory, options)
    try:
        with seeded_rng(), collector_paused(), executing(runs_as):
            report = _scan(target, specs, kwargs or {}, dtype, capture_method, name, selected, options, profile,
                           recommend, train, budget, what_ifs, decode, decode_on, spread, quantize)
            return report
    except SystemExit as exc:  # the model's constructor or forward called sys.exit()
        raise exit_error(exc, "running the model", target.source_file) from None


@isolated
def fuse(model: nn.Module | Callable[..., nn.Module] | str, inputs: Sequence[InputLike] | InputLike, *,
         path: str | None = None, weights: str | None = None, kwargs: dict | None = None,
         dtype: torch.dtype | str | None = None, attention: bool = True, rtol: float | None = None,
         atol: float | None = None, measure: MeasureOptions | bool | None = None, allow_pickle: bool = False):
    """Fold batch norms into the layers before them and rewrite hand-written attention to SDPA,
    check the result against the original on random inputs, and save it with ``torch.export``.

    Args:
        model, inputs, kwargs, dtype: as for ``scan``.
        path: where to write the ``.pt2`` (``torch.export.load(path).module()`` runs it); None saves nothing.
        weights: a state_dict file (``torch.load(weights_only=True)``, or ``.safetensors``); None uses
            random weights with random batch-norm statistics.
        attention: rewrite hand-written attention too.
        rtol, atol: the check's tolerance (default by dtype, ``archscan.transform.verify.TOLERANCES``).
        measure: also time the original and the fused model (``True`` or ``MeasureOptions`` for the device).
        allow_pickle: as for ``scan``.

    Returns:
        ``archscan.transform.FuseResult``.

    Raises:
        VerifyError: the outputs differ beyond the tolerance; nothing is saved (``error.result`` tells).
    """
    from .transform import fuse as _fuse

    dtype = model_dtype(dtype)
    specs = input_specs(inputs, dtype)
    options = MeasureOptions() if measure is True else measure or None
    device = check_options(options)[0] if options is not None else None
    target = to_target(model, allow_pickle=allow_pickle)
    with seeded_rng():
        return _fuse(target, specs, kwargs=kwargs, dtype=dtype, weights=weights, path=path, attention=attention,
                     rtol=rtol, atol=atol, device=device)


def _execution(name: str | None, profile, memory, options: MeasureOptions | None) -> Execution:
    """The execution model the question is about (``scan``'s ``execution``)."""
    from .devices.gpus import GPUS, gpu, gpu_named_like

    if name is not None:
        try:
            return execution_for(name)
        except ValueError as exc:
            names = ", ".join(sorted({g.name for g in GPUS.values() if g.capability is not None}))
            raise ArchscanError(f"no execution model for {name!r}: {exc}", hint=f"use cpu or a GPU: {names}") from None
    if options is not None:
        device = check_options(options)[0]
        if device.type == "cuda":
            return of_device(device)
    if isinstance(profile, DeviceProfile) and profile.device.startswith("cuda"):
        named = gpu(profile.name.split(" (")[0]) or gpu_named_like(profile.name)
        if named is not None:
            return of_gpu(named)
        if torch.cuda.is_available():
            return of_device(torch.device(profile.device))
    if isinstance(memory, str) and gpu(memory) is not None:
        return of_gpu(gpu(memory))
    return CPU


def _parallel(parallel, plan, interconnect, train, what_ifs: bool, decode, budget) -> dict | None:
    """``--parallel``, ``--plan`` and ``--interconnect`` checked and resolved before any analysis:
    {spec, plan, plan_name, interconnect} or None."""
    if parallel is None:
        for flag, given in (("--plan (plan=)", plan), ("--interconnect (interconnect=)", interconnect)):
            if given is not None:
                raise ArchscanError(f"{flag} only applies to a parallel step", hint="add --parallel SPEC (parallel=)")
        return None
    from .parallel import ParallelSpec, interconnect_of
    from .parallel.step import check_parallel_options

    spec = parallel if isinstance(parallel, ParallelSpec) else ParallelSpec.parse(str(parallel))
    check_parallel_options(spec, train is not None)
    if spec.auto and budget is None:
        raise ArchscanError("--parallel auto:N searches the meshes that fit a memory budget",
                            hint="add --memory with a GPU or a size (e.g. --memory h100)")
    if what_ifs or decode is not None:
        raise ArchscanError("--parallel analyses one training step: without --what-if and --decode",
                            hint="run those in a scan of their own")
    function, plan_name = plan, None
    if isinstance(plan, str):
        from .load.targets import resolve_target

        found = resolve_target(plan)
        if found.factory is None:
            raise ArchscanError(f"--plan {plan} is not a function", hint="give file.py:function, function(model, mesh) -> model")
        function, plan_name = found.factory, plan
    if function is not None and spec.auto:
        raise ArchscanError("--plan with --parallel auto:N: the search applies archscan's own plans",
                            hint="give a mesh (fsdp=8,tp=8) with --plan")
    return {"spec": spec, "plan": function, "plan_name": plan_name,
            "interconnect": interconnect_of(None, interconnect) if interconnect is not None else None}


def _budget(memory: str | int | None, specs) -> "Budget | None":
    """The memory budget asked for, checked before any analysis (a size, a GPU name, bytes)."""
    if memory is None:
        return None
    from .memory.budget import Budget, check_batchable, parse_budget

    check_batchable(specs)
    if isinstance(memory, int) and not isinstance(memory, bool):
        if memory <= 0:
            raise ArchscanError(f"a memory budget of {memory} bytes is no memory at all", hint="give a size above zero")
        return Budget(memory, fmt_bytes(memory) if memory % (1 << 20) == 0 else f"{memory:,} bytes")
    return parse_budget(str(memory))


def _budget_model(target, specs, kwargs, dtype, budget) -> nn.Module:
    """The fake model the budget's searches run, built before any analysis: a budget the weights
    alone exceed is refused first, before the capture and the training step run."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .load.building import build_fake
    from .memory import budget as mb

    model = build_fake(target, kwargs, dtype, FakeTensorMode(allow_non_fake_inputs=True), specs)
    if budget is not None:
        mb.check_weights_fit(sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]), budget)
    return model


def _with_budget(report: Report, model: nn.Module, target, specs, kwargs, dtype, train: TrainOptions | None, budget,
                 what_ifs: bool = False) -> Report:
    """``report.memory`` with the largest batch that fits ``budget`` (when there is one) and, for a
    training step, the checkpointing plan and the what-ifs asked for (``archscan.memory.budget``);
    ``model`` is ``_budget_model``'s."""
    from .memory import budget as mb

    limit, counts = None, None
    if budget is not None:
        budget, limit, counts = mb.on_execution(budget)
    with limited(limit):
        section = _budget_section(report, model, target, specs, kwargs, dtype, train, budget, what_ifs, limit)
    if "budget" in section:
        section["budget"]["counts"] = counts
    return dataclasses.replace(report, memory={**(report.memory or {}), **section})


def _budget_section(report: Report, model: nn.Module, target, specs, kwargs, dtype, train: TrainOptions | None,
                    budget, what_ifs: bool, limit: int | None) -> dict:
    """``_with_budget``'s section, the budget as the execution model counts it (``limit``: what
    the simulated caching allocator may reserve, on a GPU)."""
    from .memory import budget as mb, forward_memory

    def counted(memory: dict) -> int:
        return mb.counted_bytes(memory, budget, limit)

    section: dict = {}
    if train is not None:
        step = report.training_step
        if step["basis"] != "fake tensors":
            raise ArchscanError("--memory searches the batch on fake tensors, and this training step needs tensor values",
                                hint="scan without --memory; the step's peak is in the report")

        def run(options: TrainOptions, dt, sp) -> dict:  # one fake model for every step in the model's dtype
            return train_step(target, sp, options, kwargs, dt, model=model if dt == dtype else None)

        def peak_of(batch: int) -> tuple[int, dict]:
            got = run(train, dtype, mb.batched(specs, batch))
            return counted(got["memory"]), got["phase_peaks"]

        rows = mb.candidates(model, step)
        if what_ifs:
            section["what_ifs"] = mb.what_ifs(step, train, dtype, specs, run, model, rows)
        if budget is None:
            return section
        found = mb.largest_batch(peak_of, budget.bytes)
        section["checkpoint_candidates"] = rows
        if counted(run(train, dtype, specs)["memory"] if limit is not None else step["memory"]) > budget.bytes:
            try:
                plan = mb.checkpoint_plan(step, rows, budget.bytes,
                                          lambda paths: run(dataclasses.replace(train, checkpoint=paths), dtype, specs),
                                          count=counted)
            except CaptureError as exc:  # the budget's answer stands; the plan says why it has none
                plan = mb.no_plan(budget.bytes, f"the step with checkpointed blocks did not run ({exc.args[0]})")
            section["checkpoint_plan"] = {**plan, **({"code": mb.checkpoint_code(plan["modules"], plan.get("cache_off", False))} if plan["modules"] else {})}
    else:
        def peak_of(batch: int) -> int:
            got = forward_memory(model, mb.batched(specs, batch), dtype)
            if got is None:  # the forward needs tensor values: the captured graph's lifetimes
                got = analysis(target, mb.batched(specs, batch), kwargs=kwargs, dtype=dtype, rules=()).report.memory or {}
            if "peak_bytes" not in got:
                raise ArchscanError(f"the peak memory of {target.name} at batch {batch} could not be found",
                                    hint="scan without --memory")
            return counted(got)

        found = mb.largest_batch(peak_of, budget.bytes)
    section["budget"] = {**budget.to_json(), "for": "training step" if train is not None else "inference forward", **found}
    return section


def _scan(target, specs, kwargs, dtype, capture_method, name, selected, options, profile, advise,
          train: TrainOptions | None = None, budget=None, what_ifs: bool = False, decode: int | None = None,
          decode_on: Sequence[DeviceProfile] = (), spread: dict | None = None, quantize: dict | None = None) -> Report:
    target = with_build(target, kwargs, specs)  # one build: every stage below copies it
    budget_model = (_budget_model(target, specs, kwargs, dtype, budget)
                    if (budget is not None and spread is None) or what_ifs else None)
    observers = ()
    if advise:  # the prune recommendations' channel groups, found in the capture's own run
        from .prune.groups import ChannelLabels

        observers = (ChannelLabels(),)
    found = analysis(target, specs, kwargs=kwargs, dtype=dtype, capture_method=capture_method, name=name,
                     observers=observers)
    report, captured = found.report, found.captured
    grouping = captured.observed.get(observers[0].key) if observers else None
    direct = captured.kind == "fx" and on_meta(captured.model)  # a cut copy runs the same graph
    build = (target, specs, kwargs, dtype) + ((captured.model, grouping, captured.gm.graph if direct else None)
                                              if captured.fake else (None, None, None))
    try:
        real = None if captured.fake else captured.model
        report, profile = _measure_and_predict(report, target, specs, kwargs, dtype, options, profile, real)
    except DeviceError as exc:
        exc.report = _advise(_measure_and_predict(report, target, specs, kwargs, dtype, None, profile)[0],
                             selected, None, advise, build)
        raise
    if spread is not None:
        report = dataclasses.replace(report, parallel=_parallel_section(target, specs, kwargs, dtype, train, spread,
                                                                        profile, budget))
    elif train is not None:
        report = dataclasses.replace(report, training_step=with_training_time(train_step(target, specs, train, kwargs, dtype),
                                                                              profile))
    if (budget is not None and spread is None) or what_ifs:
        report = _with_budget(report, budget_model, target, specs, kwargs, dtype, train, budget, what_ifs)
    variants, kv_ratio = None, 1.0
    if quantize is not None:
        report, variants, kv_ratio = _quant(report, captured.model, quantize, profile, dtype)
    if decode is not None:
        from .llm.decode import decode_step

        named = profile is not None and profile.created.startswith("datasheet")  # a named GPU: its speed grid
        llm = decode_step(target, specs, decode, kwargs, dtype, profile, model=captured.model if captured.fake else None,
                          grid=named, others=decode_on, variants=variants)
        report = dataclasses.replace(report, phases=llm["phases"], kv_cache=llm["kv_cache"])
        if quantize is not None:
            report = dataclasses.replace(report, quant=_quant_decode(report, quantize["kv"], kv_ratio))
    report = _advise(report, selected, profile, advise, build)  # last: rules read measurements
    return _verify_fusion(report, target, specs, kwargs, dtype, options) if advise and options is not None else report


def _timed_gpu(profile):
    """The named GPU a question is timed on: the profile's, else the execution model's where it is a
    GPU with datasheet figures; None for the CPU."""
    from .devices.gpus import gpu as named_gpu
    from .measure.gpu import gpu_of
    from .memory.gpu import current

    gpu = gpu_of(profile) if profile else None
    if gpu is None and current().is_gpu:
        found = named_gpu(current().name)
        gpu = found if found is not None and found.bf16_tflops is not None else None
    return gpu


def _quant_options(quant, kv, keep, decode, spread, train=None) -> dict | None:
    """``--quant``, ``--kv`` and ``--keep`` checked before any analysis: {scheme, kv, keep} or None."""
    if quant is None and kv is None:
        if keep:
            raise ArchscanError("--keep names the layers --quant leaves in high precision", hint="add --quant SCHEME")
        return None
    from .quant import parse_kv, parse_scheme, torchao

    scheme = parse_scheme(quant) if quant is not None else None
    if kv is not None and decode is None:
        raise ArchscanError("--kv quantizes the KV cache of a decode step", hint="add --decode L")
    if spread is not None or train is not None:
        raise ArchscanError("--quant analyses inference; --train a training step (quantization-aware training is "
                            "not modelled)", hint="run them in scans of their own")
    if scheme is not None:
        torchao()  # missing: one line saying what to install, before any analysis
    return {"scheme": scheme, "kv": parse_kv(kv) if kv is not None else None, "keep": tuple(keep or ())}


def _quant(report: Report, model, quantize: dict, profile, dtype):
    """(the report with ``quant``, the decode step's variants, the KV cache's bytes per element as
    quantized over as held) for ``scan(quant=..., kv=...)``."""
    from .quant import decode_variant, plan_layers, quant_section, quantized

    scheme, chosen = quantize["scheme"], {}
    if scheme is not None:
        gpu = _timed_gpu(profile)
        layers = plan_layers(model, report, scheme, gpu=gpu, profile=profile, keep=quantize["keep"])
        report = dataclasses.replace(report, quant=quant_section(model, report, scheme, gpu=gpu, profile=profile,
                                                                 layers=layers))
        chosen = quantized(layers)
    kv_ratio = 1.0
    if quantize["kv"] is not None:
        from .quant import KV_SCHEMES

        held = next((p.dtype for p in model.parameters() if p.is_floating_point()), dtype or torch.float32)
        kv_ratio = KV_SCHEMES[quantize["kv"]] / torch.empty((), dtype=dtype or held).element_size()
    return report, {"quantized": decode_variant(chosen, scheme, kv_ratio)}, kv_ratio


def _quant_decode(report: Report, kv: str | None, kv_ratio: float) -> dict:
    """``report.quant`` with the decode step before and after, and the KV cache per token."""
    section = dict(report.quant or {"scheme": None})
    step = report.phases["decode"]
    keys = ("weight_bytes", "mac_bytes", "predicted_ms", "served_ms", "tokens_per_s", "served_tokens_per_s")
    before = {k: step[k] for k in keys if step.get(k) is not None}
    after = {k: step["quantized"][k] for k in keys if step["quantized"].get(k) is not None}
    section["decode"] = {"context": step["context"], "before": before, "after": after}
    for key, name in (("tokens_per_s", "speedup"), ("served_tokens_per_s", "served_speedup")):
        if before.get(key) and after.get(key):
            section["decode"][name] = after[key] / before[key]
    if kv is not None:
        per_token = report.kv_cache["bytes_per_token"]
        section["kv"] = {"scheme": kv, "bytes_per_token": per_token,
                         "bytes_per_token_after": round(per_token * kv_ratio),
                         "convention": "one byte an element; a scale per tensor, negligible"}
    return section


def _parallel_section(target, specs, kwargs, dtype, train: TrainOptions, spread: dict, profile, budget) -> dict:
    """``report.parallel``: the step over the mesh, timed on the GPU of ``profile`` or of the
    execution model, the budget counted as the execution model counts it."""
    from .memory import budget as mb
    from .parallel import analyse

    gpu = _timed_gpu(profile)
    limit = None
    if budget is not None:
        budget, limit, _ = mb.on_execution(budget)
    with limited(limit):
        return analyse(target, specs, train, spread["spec"], kwargs=kwargs, dtype=dtype, plan=spread["plan"],
                       plan_name=spread["plan_name"], gpu=gpu, interconnect=spread["interconnect"], budget=budget,
                       limit=limit)


def _verify_fusion(report: Report, target, specs, kwargs, dtype, options) -> Report:
    """With a measurement, apply the fuse/sdpa recommendations to the real model: checked against
    the original (``verified``) and timed before and after on the device (``measured_saving``)."""
    kinds = {"fuse", "sdpa"}
    if not any(r.kind in kinds for r in report.recommendations):
        return report
    from .transform import fuse as _fuse

    try:
        result = _fuse(target, specs, kwargs=kwargs, dtype=dtype, device=check_options(options)[0])
    except ArchscanError as exc:  # not exportable, or the check failed: the estimate stands, unverified
        return dataclasses.replace(report, warnings=report.warnings + (f"the fusion could not be verified: {exc}",))
    lat, before, after = result.latency or {}, result.before, result.after
    saving = {"mac_bytes": before["mac_bytes"] - after["mac_bytes"], "kernels": before["kernels"] - after["kernels"],
              "params": before["params"] - after["params"], "flops": before["flops"] - after["flops"]}
    if lat.get("before_ms") is not None:
        saving["ms"] = lat["before_ms"] - lat["after_ms"]
        saving["device"] = lat["device"]
    done = {"fuse": bool(result.folded), "sdpa": bool(result.attention)}
    recs = tuple(dataclasses.replace(r, verified=result.check.passed and done[r.kind],
                                     measured_saving={**saving, "applied_together": sorted(k for k in done if done[k])})
                 if r.kind in kinds else r for r in report.recommendations)
    return dataclasses.replace(report, recommendations=recs)


def _advise(report: Report, selected: list[str], profile, advise: bool,
            build=(None, (), None, None, None, None, None)) -> Report:
    """Findings, then the recommendations that answer them (one graph view for both); ``build``:
    (target, specs, kwargs, dtype, the fake or meta model, its channel groups or None, the fx
    graph of its direct run or None), for the recommenders that count changed copies of it."""
    if not selected and not advise:
        return report
    report, ctx = check_rules(report, selected)
    target, specs, kwargs, dtype, model, grouping, graph = build
    return _recommend(report, profile, rules=ctx, target=target, specs=specs, kwargs=kwargs, dtype=dtype,
                      model=model, grouping=grouping, graph=graph) if advise else report


def _measure_and_predict(report, target, specs, kwargs, dtype, options, profile, real=None):
    """(report with measurements and predictions, the profile that predicted or None)."""
    if options is not None:
        report = measure_report(report, target, specs, kwargs, dtype, options, real)
    if profile is False:
        return report, None
    if profile is None or profile is True:
        device = resolve_device(options.device if options is not None else None)
        profile, warnings = cached_profile(device, options.threads if options is not None else None)
        report = dataclasses.replace(report, warnings=report.warnings + tuple(warnings)) if warnings else report
    return (apply_predictions(report, profile), profile) if profile is not None else (report, None)


@isolated
def compare(targets: Sequence[str], input_sets: Sequence[str] = (), batches: Sequence[int] = (), **options):
    """``archscan compare``: every model scanned (``scan``: measured and predicted where asked,
    with its findings and recommendations) and summarised in a row; see ``archscan.compare.compare``
    for the arguments. Returns an ``archscan.compare.Comparison``."""
    from .compare import compare as _compare

    return _compare(targets, input_sets, batches, analyse=scan, **options)
