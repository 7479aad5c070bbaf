"""The ``archscan`` command: a thin typer face over ``archscan.scan``.

``archscan MODEL --input ...`` is the main job; sub-commands sit beside it
(``archscan zoo``). Every ``ArchscanError`` becomes one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer

from .errors import ArchscanError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="archscan: why a PyTorch model is slow, and what to change.\n\n"
                       "Main job: archscan MODEL --input 1,3,224,224   (MODEL = file.py:Name | pkg.mod:factory | zoo:name)")

_SUBCOMMANDS = {"scan", "zoo", "calibrate", "guidelines"}
_state = {"debug": False}


@app.command("scan")
def scan_cmd(
    model: Annotated[str, typer.Argument(help="file.py:Name, package.module:factory or zoo:name")],
    input: Annotated[Optional[list[str]], typer.Option("--input", "-i", help="input shape, e.g. 1,3,224,224 or 1,128:int64; repeat for several inputs (zoo models have a default)")] = None,
    kwargs: Annotated[Optional[str], typer.Option("--kwargs", "-k", help="constructor arguments: name=value,name=value (Python literals)")] = None,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="run the model in this dtype: float32, bfloat16, float16")] = None,
    depth: Annotated[int, typer.Option("--depth", "-d", help="module hierarchy depth of the table")] = 2,
    nodes: Annotated[bool, typer.Option("--nodes", help="list every graph node instead of the module table")] = False,
    capture: Annotated[str, typer.Option("--capture", help="auto (fx, then export, then eager), fx, export or eager")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="print the JSON report (schema archscan.report/1) on stdout")] = False,
    measure: Annotated[bool, typer.Option("--measure", help="time the real model per node and end to end")] = False,
    device: Annotated[Optional[str], typer.Option("--device", help="cpu or cuda[:N] (default: cuda when available)")] = None,
    amp: Annotated[Optional[str], typer.Option("--amp", help="measure under autocast: bf16 or fp16")] = None,
    channels_last: Annotated[bool, typer.Option("--channels-last", help="measure in channels_last memory format")] = False,
    threads: Annotated[Optional[int], typer.Option("--threads", help="CPU threads when measuring on the CPU")] = None,
    sweep: Annotated[bool, typer.Option("--sweep", help="with --measure: batch sizes x2/x4/x8; on a GPU also pinned input copies and channels_last")] = False,
    rules: Annotated[Optional[str], typer.Option("--rules", help="check only these rules, comma-separated (G1,G2,fuse-conv-bn,...)")] = None,
    skip_rules: Annotated[Optional[str], typer.Option("--skip-rules", help="do not check these rules, comma-separated")] = None,
    fail_on: Annotated[Optional[str], typer.Option("--fail-on", help="exit 1 when a finding is at least this severe: info, warning or error")] = None,
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks")] = False,
) -> None:
    """Analyse a model: per-layer params, FLOPs (multiply-adds), memory access cost, guideline findings."""
    from .api import scan
    from .loading import parse_kwargs, resolve_target
    from .report import render_text

    _state["debug"] = debug
    if capture not in ("auto", "fx", "export", "eager"):
        raise ArchscanError(f"unknown --capture {capture!r}", hint="use auto, fx, export or eager")
    target = resolve_target(model)
    specs = list(input or target.default_inputs)
    if not specs:
        raise ArchscanError("no --input given", hint="pass the input shape, e.g. --input 1,3,224,224 (repeat for several inputs)")
    from .rules import SEVERITIES, select_rules, worst_severity

    if fail_on is not None and fail_on not in SEVERITIES:
        raise ArchscanError(f"unknown --fail-on {fail_on!r}", hint="use info, warning or error")
    from .errors import DeviceError
    from .measure import MeasureOptions

    selected = select_rules(_csv(rules), _csv(skip_rules))
    options = MeasureOptions(device=device, amp=amp, channels_last=channels_last, threads=threads,
                             sweep=sweep) if measure else None
    device_error = None
    try:
        report = scan(target, specs, kwargs=parse_kwargs(kwargs), dtype=dtype, capture_method=capture, name=model,
                      rules=selected, measure=options)
    except DeviceError as exc:  # the static report still prints
        device_error = exc
        report = scan(target, specs, kwargs=parse_kwargs(kwargs), dtype=dtype, capture_method=capture, name=model,
                      rules=selected, profile=False)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=1))
    else:
        typer.echo(render_text(report, depth=depth, per_node=nodes))
    if device_error is not None:
        raise device_error
    worst = worst_severity(report)
    if fail_on is not None and worst is not None and SEVERITIES.index(worst) >= SEVERITIES.index(fail_on):
        typer.echo(f"archscan: {worst} findings at or above --fail-on {fail_on}", err=True)
        raise typer.Exit(1)


def _csv(text: str | None) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()] if text else []


@app.command("zoo")
def zoo_cmd(
    family: Annotated[Optional[str], typer.Argument(help="only this family (file name, e.g. shufflenetv2)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the list as JSON")] = False,
) -> None:
    """List the models of archscan's zoo (use them as zoo:NAME)."""
    from tabulate import tabulate

    from . import zoo

    names = zoo.list_models(family)
    if not names:
        raise ArchscanError(f"no zoo family {family!r}", hint="run `archscan zoo` to list all")
    entries = [zoo.get_entry(n) for n in names]
    if as_json:
        typer.echo(json.dumps([{"name": e.name, "family": e.family, "input": list(e.default_input), "summary": e.summary}
                               for e in entries], indent=1))
        return
    typer.echo(tabulate([[e.name, e.family, " ".join(e.default_input), e.summary] for e in entries],
                        headers=["name", "family", "default input", "summary"]))


@app.command("calibrate")
def calibrate_cmd(
    device: Annotated[Optional[str], typer.Option("--device", help="cpu or cuda[:N] (default: cuda when available)")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", help="CPU threads")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="small problems and budgets: seconds, less accurate; replaces the cached profile")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the profile as JSON")] = False,
) -> None:
    """Measure this device once (matmul FLOP/s per dtype, bandwidth, launch overhead) and cache its profile."""
    from .measure import calibrate, save_profile
    from .report.text import fmt_count

    with _status("calibrating") as say:
        profile = calibrate(device, threads=threads, quick=quick, progress=say)
    path = save_profile(profile)
    if as_json:
        typer.echo(json.dumps(profile.to_json(), indent=1))
        return
    def line(label: str, text: str) -> None:
        typer.echo(f"{label:<15}{text}")

    line("device", f"{profile.device} ({profile.name})" + (f", {profile.threads} threads" if profile.threads else ""))
    for dt, rate in profile.peak_flops.items():
        line(f"matmul {dt}", f"{fmt_count(rate)} multiply-adds/s")
    for cat, rate in profile.class_flops.items():
        line(cat, f"{fmt_count(rate)} multiply-adds/s (float32)")
    line("bandwidth", f"{profile.bandwidth / 1e9:.1f} GB/s (large copy)")
    for cat, bw in profile.class_bandwidth.items():
        line(cat, f"{bw / 1e9:.1f} GB/s")
    line("overhead", f"{profile.launch_overhead_ms * 1e3:.1f} us per kernel; per call: " + ", ".join(
        f"{cat} {ms * 1e3:.1f} us" for cat, ms in profile.class_overhead_ms.items()))
    line("saved", str(path))


@app.command("guidelines")
def guidelines_cmd(
    device: Annotated[Optional[str], typer.Option("--device", help="cpu or cuda[:N] (default: cuda when available)")] = None,
    scale: Annotated[int, typer.Option("--scale", help="the paper's channel multiplier: 1, 2 or 4")] = 1,
    batch: Annotated[Optional[int], typer.Option("--batch", help="batch size (default 8 on GPU, 1 on CPU)")] = None,
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
    unknown = [t for t in chosen if t not in ("G1", "G2", "G3", "G4")]
    if unknown:
        raise ArchscanError(f"unknown table(s) {', '.join(unknown)}", hint="use G1, G2, G3, G4")
    from .zoo import probes

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


import contextlib  # noqa: E402


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
    from .measure.run import _progress

    with _progress(total, True, label) as advance:
        yield advance


def main(argv: list[str] | None = None) -> int:
    """Console entry point: ``archscan MODEL ...`` runs ``scan``; ``archscan zoo`` etc. sit beside it."""
    args = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in args if not a.startswith("-")), None)
    if first is not None and first not in _SUBCOMMANDS and args and args[0] not in ("--help", "-h"):
        args = ["scan", *args]
    try:
        rc = app(args=args, prog_name="archscan", standalone_mode=False)
        if isinstance(rc, int) and rc:
            return rc  # typer.Exit(code) comes back as a return value when not standalone
    except ArchscanError as exc:
        if _state["debug"] or "--debug" in args:
            raise
        typer.echo(f"archscan: error: {exc}", err=True)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except SystemExit as exc:
        return int(exc.code or 0)
    except KeyboardInterrupt:
        typer.echo("archscan: interrupted", err=True)
        return 130
    except Exception as exc:  # click usage errors and anything unforeseen: one line, no traceback
        import click

        if isinstance(exc, click.exceptions.ClickException):
            typer.echo(f"archscan: error: {exc.format_message()}", err=True)
            return exc.exit_code
        if "--debug" in args:
            raise
        typer.echo(f"archscan: error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", err=True)
        return 1
    return 0


def entry() -> None:
    """setuptools console-script wrapper."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
