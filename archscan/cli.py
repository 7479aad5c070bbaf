"""The ``archscan`` command: a thin typer face over ``archscan.scan``.

``archscan MODEL --input ...`` is the main job; sub-commands sit beside it
(``archscan zoo``). Every ``ArchscanError`` becomes one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from typing import Annotated, Optional

import typer

from .errors import ArchscanError, DeviceError, Terminated, VerifyError
from .files import check_writable, write_file
from .load.specs import check_arguments

app = typer.Typer(add_completion=True, pretty_exceptions_enable=False,
                  help="archscan: why a PyTorch model is slow, and what to change.\n\n"
                       "Main job: archscan MODEL --input 1,3,224,224   (MODEL = file.py:Name | pkg.mod:factory | zoo:name)\n\n"
                       "Add --debug to any command to see the traceback of an error.")

AllowPickle = Annotated[bool, typer.Option(
    "--allow-pickle", help="a .pt2 target may run code pickled inside it while it loads (torch.export.load's "
                           "unrestricted unpickling): only for files you trust; without it such a file is refused")]
_SUBCOMMANDS = {"scan", "compare", "fuse", "prune", "distill", "quantize", "zoo", "calibrate", "guidelines"}


@app.command("scan")
def scan_cmd(
    model: Annotated[str, typer.Argument(help="file.py:Name, package.module:factory or zoo:name")],
    input: Annotated[Optional[list[str]], typer.Option("--input", "-i", help="input shape, e.g. 1,3,224,224 or 1,128:int64; repeat for several inputs (zoo models have a default)")] = None,
    kwargs: Annotated[Optional[str], typer.Option("--kwargs", "-k", help="constructor arguments: name=value,name=value (Python literals; quote strings: act='relu')")] = None,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="run the model in this dtype: float32, bfloat16, float16, float64")] = None,
    depth: Annotated[int, typer.Option("--depth", "-d", min=0, help="module hierarchy depth of the table")] = 2,
    nodes: Annotated[bool, typer.Option("--nodes", help="list every graph node instead of the module table")] = False,
    capture: Annotated[str, typer.Option("--capture", help="auto (fx, then one forward recorded on fake tensors, then export), fx, eager or export")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="print the JSON report (schema archscan.report/1) on stdout; the model's own output goes to stderr")] = False,
    measure: Annotated[bool, typer.Option("--measure", help="time the real model per node and end to end")] = False,
    device: Annotated[Optional[str], typer.Option("--device", help="cpu or cuda[:N] (default: cuda when available); without --measure, whose calibrated profile predicts latency")] = None,
    amp: Annotated[Optional[str], typer.Option("--amp", help="with --measure: measure under autocast, bf16 or fp16; with --train: the step's forward runs under autocast")] = None,
    train: Annotated[bool, typer.Option("--train", help="also analyse one training step: forward, loss (--loss), backward, optimizer step; its costs and peak memory")] = False,
    optimizer: Annotated[Optional[str], typer.Option("--optimizer", help="with --train: sgd, sgd-momentum, adam or adamw (default), optionally :for-loop, :foreach or :fused")] = None,
    freeze: Annotated[Optional[list[str]], typer.Option("--freeze", help="with --train: freeze the parameters under this module path (repeat)")] = None,
    loss: Annotated[Optional[str], typer.Option("--loss", help="with --train: the loss a loop computes: auto (default: the model's own where it takes labels, cross-entropy over logits, else sum), model, cross-entropy, mse or sum")] = None,
    release_output: Annotated[bool, typer.Option("--release-output", help="with --train: the loop lets the model's output go before backward (del out); by default it holds it until the step ends")] = False,
    memory: Annotated[Optional[str], typer.Option("--memory", help="a memory budget (80GiB, 24GB, or a GPU: h100, a100-40gb, l4, ...): the largest batch that fits; with --train also a checkpointing plan")] = None,
    decode: Annotated[Optional[int], typer.Option("--decode", min=1, help="one decode step of --input's tokens (e.g. 1,1:int64) after a KV cache of this many tokens: prefill and decode phases, KV bytes, tokens/s with a profile (--device-profile h100)")] = None,
    quant: Annotated[Optional[str], typer.Option("--quant", help="analyse the model quantized with torchao: int8 (weight-only), w8a8 (dynamic int8 activations), fp8 (weight-only), int4[:gN] (weight-only, groups of N): bytes as stored, kept layers, time and tokens/s before and after (needs archscan[quant])")] = None,
    kv: Annotated[Optional[str], typer.Option("--kv", help="with --decode: the KV cache quantized too, int8 or fp8")] = None,
    keep: Annotated[Optional[list[str]], typer.Option("--keep", help="with --quant: keep these layers in high precision (a module path, its prefix or a regular expression; repeat)")] = None,
    what_if: Annotated[bool, typer.Option("--what-if", help="with --train: the step re-analysed with one change each (bf16, optimizer implementations, set_to_none=False, a frozen half, gradient accumulation, in-place)")] = False,
    memory_snapshot: Annotated[Optional[str], typer.Option("--memory-snapshot", help="with --train: write the step's allocations as a PyTorch memory snapshot (.pickle) for pytorch.org/memory_viz")] = None,
    parallel: Annotated[Optional[str], typer.Option("--parallel", help="with --train: the step over a mesh of GPUs, as torch.distributed runs it on fake tensors: fsdp=8, fsdp=8:zero2, dp=2,fsdp=4 (HSDP), tp=8, fsdp=8,tp=8, ddp=8; auto:N with --memory searches the meshes of N GPUs; --input is one rank's micro-batch")] = None,
    plan: Annotated[Optional[str], typer.Option("--plan", help="with --parallel: your parallelize function, file.py:function, called as function(model, mesh) on the meta device")] = None,
    interconnect: Annotated[Optional[str], typer.Option("--interconnect", help="with --parallel: the interconnect collectives are timed on (h100-nvlink, a100-nvlink, b200-nvlink, gb200-nvl72, h100-roce, ...); default: the GPU's own")] = None,
    channels_last: Annotated[bool, typer.Option("--channels-last", help="with --measure: measure in channels_last memory format")] = False,
    threads: Annotated[Optional[int], typer.Option("--threads", min=1, help="CPU threads when measuring on the CPU (and whose CPU profile predicts latency)")] = None,
    device_profile: Annotated[Optional[str], typer.Option("--device-profile", help="predict latency on a named GPU from its datasheet, without the GPU: h100, h100-pcie, h200, b200, a100, a100-40gb, l40s, l4")] = None,
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="count memory as this GPU runs the model: its attention kernels, workspaces and caching allocator (h100, h200, a100, l4, ...; cpu for the CPU's kernels); default: the GPU of --device-profile, --memory or --device cuda, else cpu")] = None,
    sweep: Annotated[bool, typer.Option("--sweep", help="with --measure: batch sizes x2/x4/x8; on a GPU also pinned input copies and channels_last")] = False,
    rules: Annotated[Optional[str], typer.Option("--rules", help="check only these rules, comma-separated (G1,G2,fuse-conv-bn,...)")] = None,
    skip_rules: Annotated[Optional[str], typer.Option("--skip-rules", help="do not check these rules, comma-separated")] = None,
    fail_on: Annotated[Optional[str], typer.Option("--fail-on", help="exit 1 when a finding is at least this severe: info, warning or error")] = None,
    report_path: Annotated[Optional[str], typer.Option("--report", help="also write a self-contained HTML report (plots inline) here")] = None,
    markdown: Annotated[Optional[str], typer.Option("--markdown", help="also write a Markdown report here")] = None,
    allow_pickle: AllowPickle = False,
) -> None:
    """Analyse a model: per-layer params, FLOPs (multiply-adds), memory access cost, guideline findings."""
    # every option is checked before the model is imported or built: a typo costs no analysis
    if capture not in ("auto", "fx", "export", "eager"):
        raise ArchscanError(f"unknown --capture {capture!r}", hint="use auto, fx, export or eager")
    needs_measure = [flag for flag, given in (("--amp", amp and not train), ("--channels-last", channels_last),
                                              ("--sweep", sweep)) if given]
    if needs_measure and not measure:
        raise ArchscanError(f"{', '.join(needs_measure)} only applies to a measurement", hint="add --measure (or --train for --amp)")
    needs_train = [flag for flag, given in (("--optimizer", optimizer), ("--freeze", freeze), ("--loss", loss),
                                            ("--release-output", release_output),
                                            ("--memory-snapshot", memory_snapshot), ("--what-if", what_if),
                                            ("--parallel", parallel)) if given is not None and given is not False]
    needs_parallel = [flag for flag, given in (("--plan", plan), ("--interconnect", interconnect)) if given is not None]
    if needs_parallel and parallel is None:
        raise ArchscanError(f"{', '.join(needs_parallel)} only applies to a parallel step", hint="add --parallel SPEC")
    if parallel is not None:
        from .parallel.spec import ParallelSpec

        ParallelSpec.parse(parallel)  # an unreadable spec costs no analysis
    if needs_train and not train:
        raise ArchscanError(f"{', '.join(needs_train)} only applies to a training step", hint="add --train")
    if train and measure and amp:
        raise ArchscanError("--amp with both --measure and --train is ambiguous", hint="measure and train in two runs")

    _check_quant(quant, kv, keep, decode)
    check_arguments(model, input, dtype)
    _check_report_paths(report_path, markdown, memory_snapshot)
    if memory is not None:
        from .memory.budget import parse_budget

        parse_budget(memory)  # an unreadable size costs no analysis
    _analysis_process()
    from .load.targets import parse_dtype, parse_input_spec, parse_kwargs, resolve_target
    from .measure import MeasureOptions, cached_profile, check_options, resolve_device
    from .rules import SEVERITIES, select_rules, worst_severity

    if fail_on is not None and fail_on not in SEVERITIES:
        raise ArchscanError(f"unknown --fail-on {fail_on!r}", hint=f"use {', '.join(SEVERITIES)}")
    model_dtype = parse_dtype(dtype) if dtype is not None else None
    specs = [parse_input_spec(s) for s in input or []]
    constructor_kwargs = parse_kwargs(kwargs)
    selected = select_rules(_csv(rules), _csv(skip_rules))
    training = None
    if train:
        from .memory.train import TrainOptions

        training = TrainOptions.parse(optimizer, amp, freeze or (), memory_snapshot, loss, release_output)
        amp = None if not measure else amp
    options = MeasureOptions(device=device, amp=amp, channels_last=channels_last, threads=threads, sweep=sweep)
    where = check_options(options)[0] if device is not None or measure else None
    options = options if measure else None

    from .api import scan

    with _model_output(as_json):
        target = resolve_target(model, allow_pickle)
        if not specs:
            specs = [parse_input_spec(s) for s in target.default_inputs]
        if not specs:
            raise ArchscanError("no --input given", hint="pass the input shape, e.g. --input 1,3,224,224 (repeat for several inputs)")
        # without --measure, --device/--threads name the calibrated profile that predicts latency
        profile, warnings = None, []
        if device_profile is not None:
            from .measure import datasheet_profile

            if measure or device is not None or threads:
                raise ArchscanError("--device-profile predicts without the device", hint="drop --measure, --device and --threads")
            profile = datasheet_profile(device_profile)
        elif not measure and (where is not None or threads):
            profile, warnings = cached_profile(where or resolve_device(None), threads)
            profile = profile or False
        try:
            report, device_error = scan(target, specs, kwargs=constructor_kwargs, dtype=model_dtype,
                                        capture_method=capture, name=model, rules=selected, measure=options,
                                        profile=profile, train=training, memory=memory,
                                        what_ifs=what_if, decode=decode, parallel=parallel, plan=plan,
                                        interconnect=interconnect, quant=quant, kv=kv, keep=keep or (),
                                        execution=gpu if gpu is not None else str(where) if where is not None else None), None
        except DeviceError as exc:
            if exc.report is None:
                raise
            report, device_error = exc.report, exc  # the measurement failed; the static report stands
    if warnings:  # the profile's, in the report as a scan without --device puts them
        report = dataclasses.replace(report, warnings=tuple(warnings) + tuple(report.warnings))
    for warning in report.warnings:
        typer.echo(f"archscan: warning: {warning}", err=True)
    data = report.to_json() if report_path or markdown or as_json else None
    _write_reports(report_path, markdown, data)
    if as_json:
        typer.echo(report_json_text(data))
    else:
        from .report.text import render_text, terminal_width

        typer.echo(render_text(report, depth=depth, per_node=nodes, width=terminal_width()))
    if device_error is not None:
        raise device_error
    worst = worst_severity(report)
    if fail_on is not None and worst is not None and SEVERITIES.index(worst) >= SEVERITIES.index(fail_on):
        typer.echo(f"archscan: {worst} findings at or above --fail-on {fail_on}", err=True)
        raise typer.Exit(1)


def _transform_arguments(input, kwargs, dtype):
    """(the model's dtype, the input specs, the constructor's keyword arguments) a transform command
    (fuse, prune, distill, quantize) reads from its options."""
    from .api import model_dtype
    from .load.targets import parse_input_spec, parse_kwargs

    return model_dtype(dtype), [parse_input_spec(s) for s in input or []], parse_kwargs(kwargs)


def _check_quant(quant: str | None, kv: str | None, keep, decode) -> None:
    """--quant, --kv and --keep read before the model is imported: a typo costs no analysis."""
    if quant is None and kv is None and not keep:
        return
    from .quant.schemes import parse_kv, parse_scheme

    if quant is not None:
        parse_scheme(quant)
    if kv is not None:
        parse_kv(kv)
        if decode is None:
            raise ArchscanError("--kv quantizes the KV cache of a decode step", hint="add --decode L")
    if keep and quant is None:
        raise ArchscanError("--keep names the layers --quant leaves in high precision", hint="add --quant SCHEME")


@app.command("fuse")
def fuse_cmd(
    model: Annotated[str, typer.Argument(help="file.py:Name, package.module:factory, zoo:name or a .pt2 file")],
    input: Annotated[Optional[list[str]], typer.Option("--input", "-i", help="input shape, e.g. 1,3,224,224; repeat for several inputs (zoo models have a default)")] = None,
    output: Annotated[Optional[str], typer.Option("--output", "-o", help="where to save the fused program (.pt2); default NAME-fused.pt2 here")] = None,
    weights: Annotated[Optional[str], typer.Option("--weights", "-w", help="a state_dict (torch.save, or .safetensors); without it, random weights with random batch-norm statistics")] = None,
    kwargs: Annotated[Optional[str], typer.Option("--kwargs", "-k", help="constructor arguments: name=value,name=value")] = None,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="fuse and check in this dtype: float32, bfloat16, float16")] = None,
    attention: Annotated[bool, typer.Option("--attention/--no-attention", help="rewrite hand-written attention to scaled_dot_product_attention")] = True,
    rtol: Annotated[Optional[float], typer.Option("--rtol", min=0, help="relative tolerance of the check (default by dtype: 1e-4 for float32)")] = None,
    atol: Annotated[Optional[float], typer.Option("--atol", min=0, help="absolute tolerance of the check (default by dtype: 1e-6 for float32)")] = None,
    measure: Annotated[bool, typer.Option("--measure", help="time the original and the fused model end to end")] = False,
    device: Annotated[Optional[str], typer.Option("--device", help="with --measure: cpu or cuda[:N] (default: cuda when available)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON (schema archscan.fuse/1)")] = False,
    allow_pickle: AllowPickle = False,
) -> None:
    """Fold batch norms into the layers before them (and attention into SDPA), check, save a .pt2."""
    check_arguments(model, input, dtype)
    from .transform import fuse, output_path

    where = _transform_device(measure, device, weights)
    model_type, specs, constructor_kwargs = _transform_arguments(input, kwargs, dtype)
    with _model_output(as_json):
        target, specs = _target_and_inputs(model, specs, model_type, allow_pickle)
        path = output or output_path(model)
        failed = None
        with _status("fusing"):
            try:
                result = fuse(target, specs, kwargs=constructor_kwargs, dtype=model_type,
                              weights=weights, path=path, attention=attention, rtol=rtol, atol=atol, device=where)
            except VerifyError as exc:  # what was done is shown; nothing was saved
                result, failed = exc.result, exc
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=1))
    else:
        from .report.fuse import fuse_text
        from .report.text import terminal_width

        typer.echo(fuse_text(result, width=terminal_width()))
    if failed is not None:
        raise failed


@app.command("prune")
def prune_cmd(
    model: Annotated[str, typer.Argument(help="file.py:Name, package.module:factory or zoo:name")],
    input: Annotated[Optional[list[str]], typer.Option("--input", "-i", help="input shape, e.g. 1,3,224,224; repeat for several inputs (zoo models have a default)")] = None,
    ratio: Annotated[Optional[float], typer.Option("--ratio", "-r", help="fraction of each group's channels to cut (kept counts are rounded to multiples of 8); default 0.3, and 0.25 and 0.5 with --list")] = None,
    group: Annotated[Optional[list[int]], typer.Option("--group", "-g", help="cut only this channel group (repeat; default: every group that can be cut); --list shows them")] = None,
    list_groups: Annotated[bool, typer.Option("--list", help="list the coupled channel groups and exit")] = False,
    output: Annotated[Optional[str], typer.Option("--output", "-o", help="where to save the pruned program (.pt2); default NAME-pruned.pt2 here")] = None,
    weights: Annotated[Optional[str], typer.Option("--weights", "-w", help="a state_dict: channels are then cut by importance (filter norms, BN gamma); without it, structurally (the last channels)")] = None,
    kwargs: Annotated[Optional[str], typer.Option("--kwargs", "-k", help="constructor arguments: name=value,name=value")] = None,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="build the model in this dtype")] = None,
    measure: Annotated[bool, typer.Option("--measure", help="time the original and the pruned model end to end")] = False,
    device: Annotated[Optional[str], typer.Option("--device", help="with --measure: cpu or cuda[:N]")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON (schema archscan.prune/1, or archscan.groups/1 with --list)")] = False,
    allow_pickle: AllowPickle = False,
) -> None:
    """Cut coupled channel groups by module surgery (smaller weights, not masks), check, save a .pt2."""
    check_arguments(model, input, None)
    _analysis_process()
    from .prune import kept_channels

    where = _transform_device(measure, device, weights)
    if ratio is not None:
        kept_channels(16, ratio)  # a bad ratio fails before anything is built
    model_type, specs, constructor_kwargs = _transform_arguments(input, kwargs, dtype)
    with _model_output(as_json):
        target, specs = _target_and_inputs(model, specs, model_type, allow_pickle)
        if list_groups:
            from .measure import cached_profile, resolve_device
            from .prune import DEFAULT_RATIOS, group_table

            profile = cached_profile(resolve_device(None), None)[0]
            with _status("tracing channels"):
                grouping, rows = group_table(target, specs, constructor_kwargs, model_type,
                                             (ratio,) if ratio is not None else DEFAULT_RATIOS, profile)
    if list_groups:  # printed outside _model_output: with --json, stdout carries the JSON alone
        if as_json:
            typer.echo(json.dumps({"schema": "archscan.groups/1", "model": model, "groups": rows,
                                   "ops_without_rule": grouping.unknown_ops}, indent=1))
        else:
            from .report.prune import groups_text
            from .report.text import terminal_width

            typer.echo(groups_text(rows, grouping.unknown_ops, width=terminal_width()))
        return
    with _model_output(as_json):
        from .prune import prune
        from .load.targets import output_path

        path = output or output_path(model, "pruned")
        with _status("pruning"):
            result = prune(target, specs, ratio=0.3 if ratio is None else ratio, group_ids=group, kwargs=constructor_kwargs, dtype=model_type,
                           weights=weights, path=path, device=where)
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=1))
    else:
        from .report.prune import prune_text
        from .report.text import terminal_width

        typer.echo(prune_text(result, width=terminal_width()))


@app.command("distill")
def distill_cmd(
    model: Annotated[str, typer.Argument(help="file.py:Name, package.module:factory or zoo:name")],
    input: Annotated[Optional[list[str]], typer.Option("--input", "-i", help="input shape, e.g. 1,3,224,224; repeat for several inputs (zoo models have a default)")] = None,
    student: Annotated[Optional[str], typer.Option("--student", "-s", help="the student to build, by id, e.g. depth:layer3:1 or shuffle:layer2.1 (default: the best; the output lists the others)")] = None,
    output: Annotated[Optional[str], typer.Option("--output", "-o", help="where to save the student (.pt2); default NAME-student.pt2 here")] = None,
    kwargs: Annotated[Optional[str], typer.Option("--kwargs", "-k", help="constructor arguments: name=value,name=value")] = None,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="build the student in this dtype: float32, bfloat16, float16")] = None,
    eval_mode: Annotated[bool, typer.Option("--eval", help="export the student in eval mode (running statistics, dropout off) instead of training mode")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON (schema archscan.distill/1)")] = False,
    allow_pickle: AllowPickle = False,
) -> None:
    """Propose a smaller student (fewer blocks, or ShuffleNetV2 units), check it, save it as a trainable .pt2."""
    check_arguments(model, input, None)
    _analysis_process()
    from .distill import distill
    from .load.targets import output_path

    model_type, specs, constructor_kwargs = _transform_arguments(input, kwargs, dtype)
    with _model_output(as_json):
        target, specs = _target_and_inputs(model, specs, model_type, allow_pickle)
        with _status("distilling"):
            result = distill(target, specs, student=student, path=output or output_path(model, "student"),
                             kwargs=constructor_kwargs, dtype=model_type, train=not eval_mode)
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=1))
    else:
        from .report.distill import distill_text
        from .report.text import terminal_width

        typer.echo(distill_text(result, width=terminal_width()))


@app.command("quantize")
def quantize_cmd(
    model: Annotated[str, typer.Argument(help="file.py:Name, package.module:factory or zoo:name")],
    scheme: Annotated[str, typer.Option("--scheme", "-s", help="int8 (weight-only), w8a8 (dynamic int8 activations), fp8 (weight-only) or int4[:gN] (weight-only, groups of N: 32, 64, 128, 256)")],
    input: Annotated[Optional[list[str]], typer.Option("--input", "-i", help="input shape, e.g. 1,3,224,224; repeat for several inputs (zoo models have a default)")] = None,
    output: Annotated[Optional[str], typer.Option("--output", "-o", help="where to save the quantized program (.pt2); default NAME-SCHEME.pt2 here")] = None,
    weights: Annotated[Optional[str], typer.Option("--weights", "-w", help="a state_dict (torch.save, or .safetensors); without it, random weights, and the drift is no verdict on a trained model")] = None,
    keep: Annotated[Optional[list[str]], typer.Option("--keep", help="keep these layers in high precision (a module path, its prefix or a regular expression; repeat)")] = None,
    budget: Annotated[Optional[str], typer.Option("--budget", help="a size the parameters must fit (5MiB, 12MB): the least sensitive layers are quantized first until they do")] = None,
    kwargs: Annotated[Optional[str], typer.Option("--kwargs", "-k", help="constructor arguments: name=value,name=value")] = None,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="build and check the model in this dtype: float32, bfloat16, float16")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON (schema archscan.quantize/1)")] = False,
    allow_pickle: AllowPickle = False,
) -> None:
    """Quantize the linear layers with torchao, check the drift against the original, save a .pt2."""
    check_arguments(model, input, dtype)
    from .quant.schemes import parse_scheme

    chosen = parse_scheme(scheme)  # a typo costs no analysis
    limit = None
    if budget is not None:
        from .quant.apply import parse_size

        limit = parse_size(budget)
    from .load.targets import output_path

    path = output or output_path(model, chosen.label.replace(":", "-"))
    check_writable(path, "-o")
    _transform_device(False, None, weights)
    from .quant.schemes import torchao

    torchao()  # missing: one line saying what to install, before anything is built
    _analysis_process()
    model_type, specs, constructor_kwargs = _transform_arguments(input, kwargs, dtype)
    with _model_output(as_json):
        from .quant.apply import quantize

        target, specs = _target_and_inputs(model, specs, model_type, allow_pickle)
        with _status("quantizing"):
            result = quantize(target, specs, chosen, weights=weights, keep=keep or (), budget=limit, path=path,
                              kwargs=constructor_kwargs, dtype=model_type)
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=1))
    else:
        from .quant.apply import quantize_text
        from .report.text import terminal_width

        typer.echo(quantize_text(result, width=terminal_width()))


_CONSOLE = False  # set by ``entry``: this process is one archscan command, not a library caller's


def _analysis_process() -> None:
    """A command that analyses on fake tensors and compiles nothing: in the console process, keep
    torch's compiler stack from loading until something uses it (``archscan.capture.nocompile``)."""
    if _CONSOLE:
        from .capture import nocompile

        nocompile.install()


def _transform_device(measure: bool, device: str | None, weights: str | None):
    """The options fuse and prune share, checked before the model is built: the device a
    measurement runs on (None without --measure), and that the weights file is there."""
    if device is not None and not measure:
        raise ArchscanError("--device only applies to a measurement", hint="add --measure")
    if weights is not None and not os.path.isfile(weights):
        raise ArchscanError(f"no such weights file: {weights}", hint="give a state_dict saved with torch.save(model.state_dict(), path)")
    if not measure:
        return None
    from .measure import MeasureOptions, check_options

    return check_options(MeasureOptions(device=device))[0]


def _target_and_inputs(model: str, specs: list, model_type, allow_pickle: bool = False):
    """The resolved target and its inputs (the --input given, else the target's defaults), in the model's dtype."""
    from .api import input_specs
    from .load.targets import parse_input_spec, resolve_target

    target = resolve_target(model, allow_pickle)
    specs = specs or [parse_input_spec(s) for s in target.default_inputs]
    if not specs:
        raise ArchscanError("no --input given", hint="pass the input shape, e.g. --input 1,3,224,224")
    return target, input_specs(specs, model_type)


@contextlib.contextmanager
def _model_output(as_json: bool):
    """With --json, stdout carries the report alone: what the model prints goes to stderr."""
    if not as_json:
        yield
        return
    with contextlib.redirect_stdout(sys.stderr):
        yield


def _csv(text: str | None) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()] if text else []


@app.command("compare")
def compare_cmd(
    models: Annotated[list[str], typer.Argument(help="models to compare: targets or zoo patterns ('zoo:shufflenet_v2_*'); MODEL@1,3,32,32 gives one its own input")],
    input: Annotated[Optional[list[str]], typer.Option("--input", "-i", help="an input set for every model (zoo models default to their own); repeat to sweep sets; several inputs of a set joined by ';'")] = None,
    batch: Annotated[Optional[str], typer.Option("--batch", help="batch sizes to sweep, e.g. 1,8,32 (replace the first dimension of every input)")] = None,
    measure: Annotated[bool, typer.Option("--measure", help="time each model (one at a time): latency and throughput")] = False,
    device: Annotated[Optional[str], typer.Option("--device", help="cpu or cuda[:N]; without --measure, whose calibrated profile predicts latency")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", min=1, help="CPU threads when measuring on the CPU")] = None,
    sort: Annotated[Optional[str], typer.Option("--sort", help="sort by a column: latency_ms, predicted_ms, throughput, flops, mac_bytes, params, intensity, flops_per_ms, elementwise_mac_share, fragments, findings, model")] = None,
    baseline: Annotated[Optional[str], typer.Option("--baseline", help="the model the ratios are against (default: the first)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the comparison as JSON (schema archscan.compare/1)")] = False,
    report: Annotated[Optional[str], typer.Option("--report", help="also write a self-contained HTML report here")] = None,
    markdown: Annotated[Optional[str], typer.Option("--markdown", help="also write a Markdown report here")] = None,
    decode: Annotated[Optional[int], typer.Option("--decode", min=1, help="one decode step of --input's tokens after a KV cache of this many tokens: KV bytes per token and at 32k, the step's bytes, tokens/s per --device-profile")] = None,
    device_profile: Annotated[Optional[str], typer.Option("--device-profile", help="named GPUs to predict on from their datasheets, comma-separated (h100,h200); the first predicts every column")] = None,
    allow_pickle: AllowPickle = False,
) -> None:
    """Compare models side by side: params, FLOPs, MAC, latency, guideline findings, top recommendation."""
    from .compare import SORT_KEYS, jobs

    if sort is not None and sort not in SORT_KEYS:
        raise ArchscanError(f"unknown --sort {sort!r}", hint=f"use one of: {', '.join(SORT_KEYS)}")
    batches = _batches(batch)
    _check_report_paths(report, markdown)
    sets = list(input or [])
    planned = jobs(models, sets, batches)  # every name and input checked before torch is imported
    _analysis_process()
    from .api import compare
    from .measure import MeasureOptions, cached_profile, check_options, resolve_device

    options = MeasureOptions(device=device, threads=threads)
    where = check_options(options)[0] if device is not None or measure else None
    profile, others = None, []
    if device_profile is not None:
        from .measure import datasheet_profile

        if measure or device is not None or threads:
            raise ArchscanError("--device-profile predicts without the device", hint="drop --measure, --device and --threads")
        profile, *others = [datasheet_profile(name.strip()) for name in device_profile.split(",") if name.strip()]
    elif not measure and (where is not None or threads):
        profile = cached_profile(where or resolve_device(None), threads)[0] or False
    with _bar(len(planned), "comparing") as advance, _model_output(as_json):
        started = []

        def progress(model: str, phase: str) -> None:  # called as each model starts
            advance(1 if started else 0, f"{model}: {phase}")
            started.append(model)

        result = compare(models, sets, batches, measure=options if measure else None, profile=profile,
                         baseline=baseline, sort=sort, progress=progress, decode=decode, decode_on=others,
                         allow_pickle=allow_pickle)
    data = result.to_json()
    _write_reports(report, markdown, data, result.reports)
    if as_json:
        typer.echo(json.dumps(data, indent=1))
    else:
        from .report.compare import compare_text
        from .report.text import terminal_width

        typer.echo(compare_text(data, terminal_width()))
    if result.failed:
        typer.echo(f"archscan: {len(result.failed)} of {len(data['rows'])} models failed", err=True)
        raise typer.Exit(3)


def _batches(text: str | None) -> list[int]:
    try:
        sizes = [int(b) for b in _csv(text)]
    except ValueError:
        sizes = [0]
    if any(b < 1 for b in sizes):
        raise ArchscanError(f"malformed --batch {text!r}", hint="write batch sizes as positive integers: --batch 1,8,32")
    return sizes


def _check_report_paths(html_path: str | None, markdown_path: str | None, snapshot_path: str | None = None) -> None:
    """Before any analysis: the report files can be written (``files.check_writable``, as they will be), and
    matplotlib is there for the HTML plots."""
    for path, flag in ((html_path, "--report"), (markdown_path, "--markdown"), (snapshot_path, "--memory-snapshot")):
        if path is not None:
            check_writable(path, flag)
    if html_path is not None:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise ArchscanError("--report draws its plots with matplotlib, which is not installed",
                                hint="pip install matplotlib (or pip install 'archscan[plots]')")


def report_json_text(data: dict) -> str:
    """A report as ``--json`` prints it: as ``json.dumps(data, indent=1)`` would, except each row
    of ``nodes`` and ``modules`` on one line of its own. A recording has a node per executed op,
    and json's indenting encoder is pure Python (HF Mamba-130m's 22,000 nodes: 0.35 s; a line
    each through its C encoder: 0.1 s)."""
    parts = []
    for key, value in data.items():
        if key in ("nodes", "modules") and value:
            text = "[\n  " + ",\n  ".join(json.dumps(row) for row in value) + "\n ]"
        else:
            text = json.dumps(value, indent=1).replace("\n", "\n ")
        parts.append(f" {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(parts) + "\n}"


def _write_reports(html_path: str | None, markdown_path: str | None, data: dict, reports: list[dict] | None = None) -> None:
    """The HTML and Markdown reports of one report (``reports`` None) or of a comparison."""
    for path, kind in ((html_path, "html"), (markdown_path, "markdown")):
        if path is None:
            continue
        if kind == "html":
            from .report.html import compare_html, report_html

            text = report_html(data) if reports is None else compare_html(data, reports)
        else:
            from .report.markdown import compare_markdown, report_markdown

            text = report_markdown(data) if reports is None else compare_markdown(data, reports)
        write_file(path, text, "--report" if kind == "html" else "--markdown")
        typer.echo(f"archscan: wrote {path}", err=True)


@app.command("zoo")
def zoo_cmd(
    family: Annotated[Optional[str], typer.Argument(help="only this family (file name, e.g. shufflenetv2)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the list as JSON")] = False,
) -> None:
    """List the models of archscan's zoo (use them as zoo:NAME)."""
    from tabulate import tabulate

    from .zoo._catalog import catalog

    entries = sorted((e for e in catalog().values() if family is None or e.family == family), key=lambda e: e.name)
    if not entries:
        raise ArchscanError(f"no zoo family {family!r}", hint="run `archscan zoo` to list all")
    if as_json:
        typer.echo(json.dumps([{"name": e.name, "family": e.family, "input": list(e.default_input), "summary": e.summary}
                               for e in entries], indent=1))
        return
    typer.echo(tabulate([[e.name, e.family, " ".join(e.default_input), e.summary] for e in entries],
                        headers=["name", "family", "default input", "summary"]))


@app.command("calibrate")
def calibrate_cmd(
    device: Annotated[Optional[str], typer.Option("--device", help="cpu or cuda[:N] (default: cuda when available)")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", min=1, help="CPU threads")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="small problems and budgets: seconds, less accurate; replaces the cached profile")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the profile as JSON")] = False,
    force: Annotated[bool, typer.Option("--force", help="save the profile even when its measurements are unstable")] = False,
) -> None:
    """Measure this device once (matmul FLOP/s per dtype, bandwidth, launch overhead) and cache its profile."""
    from .measure import MeasureOptions, calibrate, check_options, check_profile_dir, instability, instability_error, save_profile

    where = check_options(MeasureOptions(device=device, threads=threads))[0]
    check_profile_dir()  # before minutes of measuring, not after
    with _status("calibrating") as say:
        profile = calibrate(where, threads=threads, quick=quick, progress=say)
    path = None
    save_error = None if force else instability_error(profile)  # an unstable profile is printed, not cached
    if save_error is None:
        try:
            path = save_profile(profile)
        except OSError as exc:  # the measurement is printed all the same
            save_error = ArchscanError(f"the profile could not be saved: {exc}",
                                       hint="set ARCHSCAN_CACHE_DIR to a writable directory")
    if as_json:
        typer.echo(json.dumps({**profile.to_json(), "unstable": instability(profile),
                               "saved": str(path) if path is not None else None}, indent=1))
    else:
        typer.echo(_profile_text(profile, path))
    if save_error is not None:
        raise save_error


def _profile_text(profile, path) -> str:
    """A calibrated profile as aligned label / value / spread lines; what is unstable says so."""
    from .measure import instability
    from .report.text import fmt_count

    # (label, value, key of the quantity in profile.spread)
    rows = [("device", f"{profile.device} ({profile.name})" + (f", {profile.threads} threads" if profile.threads else ""),
             None)]
    rows += [(f"matmul {dt}", f"{fmt_count(rate)} multiply-adds/s", f"peak_flops.{dt}")
             for dt, rate in profile.peak_flops.items()]
    rows += [(cat, f"{fmt_count(rate)} multiply-adds/s (float32)", f"class_flops.{cat}")
             for cat, rate in profile.class_flops.items()]
    rows.append(("bandwidth", f"{profile.bandwidth / 1e9:.1f} GB/s (large copy)", "bandwidth"))
    rows += [(cat, f"{bw / 1e9:.1f} GB/s", f"class_bandwidth.{cat}") for cat, bw in profile.class_bandwidth.items()]
    rows.append(("launch overhead", f"{profile.launch_overhead_ms * 1e3:.1f} us per kernel", "launch_overhead_ms"))
    rows += [(f"{cat} overhead", f"{ms * 1e3:.1f} us per call", f"class_overhead_ms.{cat}")
             for cat, ms in profile.class_overhead_ms.items()]
    problems = instability(profile)
    saved = str(path) if path is not None else "not saved" + (" (unstable)" if problems else "")
    rows.append(("saved", saved, None))
    width = max(len(label) for label, _, _ in rows) + 2
    value_width = max(len(value) for _, value, key in rows if key) + 2
    lines = []
    for label, value, key in rows:
        spread = f"spread {100 * profile.spread[key]:.1f}%" if key in profile.spread else ""
        note = "  ".join(x for x in (spread, f"UNSTABLE: {problems[key]}" if key in problems else "") if x)
        lines.append(f"{label:<{width}}{value:<{value_width}}{note}" if note else f"{label:<{width}}{value}")
    return "\n".join(lines)


@app.command("guidelines")
def guidelines_cmd(
    device: Annotated[Optional[str], typer.Option("--device", help="cpu or cuda[:N] (default: cuda when available)")] = None,
    scale: Annotated[int, typer.Option("--scale", help="the paper's channel multiplier: 1, 2 or 4")] = 1,
    batch: Annotated[Optional[int], typer.Option("--batch", min=1, help="batch size (default 8 on GPU, 1 on CPU)")] = None,
    tables: Annotated[str, typer.Option("--tables", help="which tables, e.g. G1,G3")] = "G1,G2,G3,G4",
    as_json: Annotated[bool, typer.Option("--json", help="print the results as JSON")] = False,
) -> None:
    """Reproduce the ShuffleNetV2 guideline benchmarks (Tables 1-4) on this device, beside the paper's figures."""
    import dataclasses

    from tabulate import tabulate

    from .measure.guidelines import run_guidelines

    if scale not in (1, 2, 4):
        raise ArchscanError(f"--scale {scale} is not one of the paper's columns", hint="use 1, 2 or 4")
    chosen = tuple(_csv(tables))
    if not chosen:
        raise ArchscanError("--tables names no table", hint="use G1, G2, G3, G4 (comma-separated)")
    unknown = [t for t in chosen if t not in ("G1", "G2", "G3", "G4")]
    if unknown:
        raise ArchscanError(f"unknown table(s) {', '.join(unknown)}", hint="use G1, G2, G3, G4")
    from .measure import resolve_device
    from .zoo import probes

    resolve_device(device)
    total = sum(len(probes.TABLES[t]) for t in chosen)
    with _bar(total, "measuring probes") as advance:
        where, results = run_guidelines(device, scale=scale, batch=batch, tables=chosen, advance=advance)
    if as_json:
        typer.echo(json.dumps({"device": where, "tables": [
            {**{k: v for k, v in dataclasses.asdict(t).items() if k != "rows"}, "ordering_holds": t.ordering_holds,
             "rows": [dataclasses.asdict(r) for r in t.rows]} for t in results]}, indent=1))
        return
    unit = "batches/s" if "cuda" in where else "images/s"
    typer.echo(f"ShuffleNetV2 guideline benchmarks on {where}")
    for t in results:
        base = t.rows[0]
        rows = [[r.name, f"{r.paper_gpu:g}", f"{r.paper_cpu:g}", f"{r.throughput:.1f}",
                 f"{r.throughput / base.throughput:.2f}", f"{r.paper_gpu / base.paper_gpu:.2f}",
                 f"{r.paper_cpu / base.paper_cpu:.2f}", f"{100 * r.spread:.1f}%"] for r in t.rows]
        typer.echo("")
        typer.echo(tabulate(rows, headers=[t.table, "paper GPU", f"paper {t.cpu_label}", f"here {unit}", "here rel",
                                           "GPU rel", f"{t.cpu_label} rel", "spread"], disable_numparse=True,
                            colalign=("left",) + ("right",) * 7))
        verdict = "holds" if t.ordering_holds else "does not hold"
        typer.echo(f"ordering {verdict} here: Spearman {t.spearman_gpu:+.2f} vs the paper's GPU column, "
                   f"{t.spearman_cpu:+.2f} vs its {t.cpu_label} column; fastest row "
                   f"{'the same' if t.same_fastest else 'different'}")


@contextlib.contextmanager
def _status(label: str):
    """A spinner on stderr while something takes a while (terminals only)."""
    if not sys.stderr.isatty():
        yield lambda _msg: None
        return
    from rich.console import Console

    with Console(stderr=True).status(label) as status:
        yield lambda msg: status.update(f"{label}: {msg}")


@contextlib.contextmanager
def _bar(total: int, label: str):
    from .measure.run import progress_bar

    with progress_bar(total, True, label) as advance:
        yield advance


def main(argv: list[str] | None = None) -> int:
    """Console entry point: ``archscan MODEL ...`` runs ``scan``; ``archscan zoo`` etc. sit beside it.

    Returns the exit code (README, "Exit codes"): 0 done, 1 findings at or above ``--fail-on``,
    2 bad usage or input, 3 the model's code failed or could not be captured, 4 a device problem,
    5 an internal error of archscan's, 130 interrupted.
    """
    if os.environ.get(_COMPLETE):  # the shell asks for completions (`archscan --install-completion`)
        app(prog_name="archscan")  # typer answers and exits
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    args = [a for a in args if a != "--debug"]
    if (empty := _empty_value(args)) is not None:
        return _report(ArchscanError(f"{empty} is empty", hint="give it a value, or leave the option out"), debug)
    if args and args[0] in _COMPLETION_OPTIONS:
        try:
            app(args=args, prog_name="archscan")
        except SystemExit as exc:  # typer prints or installs the script, then exits
            return exc.code if isinstance(exc.code, int) else 0
    if not args:
        return _report(ArchscanError("no model given", hint="usage: archscan MODEL --input 1,3,224,224; "
                                                           "`archscan --help` lists the commands"), debug)
    if args == ["--version"]:
        from importlib.metadata import version

        typer.echo(f"archscan {version('archscan')}")
        return 0
    first = next((a for a in args if not a.startswith("-")), None)
    if first is not None and first not in _SUBCOMMANDS and args[0] not in ("--help", "-h", *_COMPLETION_OPTIONS):
        args = ["scan", *args]
    try:
        rc = _app_for(args)(args=args, prog_name="archscan", standalone_mode=False)
        rc = rc if isinstance(rc, int) else 0  # typer.Exit(code) comes back as a return value
    except (KeyboardInterrupt, typer.Abort):  # click < 8.2 turns Ctrl-C into Abort
        rc = _INTERRUPTED
    except Terminated as exc:  # SIGTERM, SIGHUP (``_terminate_on_signals``)
        import signal

        typer.echo(f"archscan: terminated ({signal.Signals(exc.signum).name})", err=True)
        return 128 + exc.signum
    except typer.Exit as exc:
        rc = exc.exit_code
    except BrokenPipeError:
        return _reader_gone()
    except SystemExit as exc:  # only model code exits: archscan and typer do not
        if isinstance(exc.__context__, BrokenPipeError):  # rich exits so when the reader is gone
            return _reader_gone()
        from .load.frames import exit_error

        return _report(exit_error(exc, "running the model"), debug)
    except ArchscanError as exc:
        return _report(exc, debug)
    except Exception as exc:
        return _report(_unforeseen(exc), debug)
    if rc == _INTERRUPTED:  # typer 0.28 and later turn Ctrl-C into Exit(130)
        typer.echo("archscan: interrupted", err=True)
    return rc


def _app_for(args: list[str]) -> typer.Typer:
    """The app that parses ``args``: for a subcommand, one holding that command alone, so only its
    options are built (typer builds every registered command's, 0.06 s, before it parses one)."""
    infos = [info for info in app.registered_commands if args and info.name == args[0]]
    if len(infos) != 1:
        return app
    one = typer.Typer(add_completion=False, pretty_exceptions_enable=False, help=app.info.help)
    one.registered_commands = infos
    one.callback()(_group)  # a group still: the command is named on the line, as in the whole app
    return one


def _group() -> None:
    """archscan's commands (the group's callback: nothing to do before one runs)."""


_INTERRUPTED = 130
_COMPLETE = "_ARCHSCAN_COMPLETE"
_COMPLETION_OPTIONS = ("--install-completion", "--show-completion")


def _empty_value(args: list[str]) -> str | None:
    """The option (or argument) given an empty value (``--optimizer ""``, ``--rules=``): refused,
    never taken as the option left out."""
    for i, arg in enumerate(args):
        if arg.startswith("--") and "=" in arg and not arg.partition("=")[2].strip():
            return arg.partition("=")[0]
        if not arg.strip():
            before = args[i - 1] if i else ""
            return before if before.startswith("-") else "an argument"
    return None

_BROKEN_PIPE = 141  # 128 + SIGPIPE, what `cat` returns when its reader is gone


def _report(exc: ArchscanError, debug: bool) -> int:
    """One line on stderr (the traceback under --debug) and the error's exit code."""
    if debug:
        import traceback

        traceback.print_exception(exc.__cause__ or exc)
    typer.echo(f"archscan: error: {' '.join(str(exc).split())}", err=True)
    return exc.exit_code


def _usage_error_type() -> type:
    """click's ClickException, found from typer's public BadParameter: typer 0.28 and later ship
    their own copy of click (``typer._click``) and older versions use click itself."""
    return next((c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"), typer.BadParameter)


def _unforeseen(exc: Exception) -> ArchscanError:
    """An exception nobody turned into an ArchscanError: a usage error of the command line, the
    model's own code failing, running out of memory, or a bug in archscan."""
    if isinstance(exc, _usage_error_type()):
        ctx = getattr(exc, "ctx", None)
        command = ctx.command_path if ctx is not None else "archscan"
        error = ArchscanError(exc.format_message(), hint=f"see `{command} --help`")
        error.exit_code = getattr(exc, "exit_code", 2) or 2
        return error
    from .errors import CaptureError, InternalError
    from .load.frames import short, user_frame

    text = str(exc)
    if isinstance(exc, MemoryError) or "out of memory" in text or "can't allocate memory" in text:
        error: ArchscanError = DeviceError(f"out of memory: {short(exc)}", hint="use a smaller --input")
    elif (loc := user_frame(exc)) is not None:
        error = CaptureError(f"the model's code failed at {loc}: {short(exc)}", hint="run with --debug for the traceback")
    else:
        error = InternalError(f"internal error: {short(exc)}",
                              hint="a bug in archscan: run with --debug for the traceback and report it")
    error.__cause__ = exc
    return error


def _terminate_on_signals() -> None:
    """SIGTERM and SIGHUP unwind the command as Ctrl-C does (``errors.Terminated``), so that what
    it was writing is removed (``archscan.files``) and it exits 143 / 129 with one line. Signals
    the parent set to be ignored stay ignored."""
    import signal

    def terminate(signum, frame):
        raise Terminated(signum)

    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None and signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, terminate)


def _reader_gone() -> int:
    """The reader of stdout went away (``archscan ... | head``): stop quietly, as a process killed by
    SIGPIPE would, and point stdout at /dev/null so that the final flush does not fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a real file (a test's capture)
        pass
    return _BROKEN_PIPE


def entry() -> None:
    """setuptools console-script wrapper. A command is one short-lived process: the cyclic garbage
    collector stays off (it would walk torch's whole object graph on every threshold crossing while
    torch imports), and once its output is flushed the process ends without the interpreter's
    teardown (a final collection over torch's objects, every module cleared: ~0.1 s). Analysis
    commands keep ``torch._dynamo`` unloaded (``archscan.capture.nocompile``). The library leaves the
    caller's modules alone and pauses the collector only while ``archscan.scan`` runs
    (``capture.collector_paused``)."""
    import gc

    global _CONSOLE
    _CONSOLE = True
    gc.disable()
    _terminate_on_signals()
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        code = _reader_gone()
    except (OSError, ValueError):
        pass
    os._exit(code)  # nothing is left to finalise: skip tearing down torch's modules (~0.1 s)


if __name__ == "__main__":
    entry()
