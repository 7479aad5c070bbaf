"""The everyday PyTorch tuning rules (shared/reference/tuning_rules.md) that a captured model shows."""

from __future__ import annotations

from collections import defaultdict

from ..results import Finding, NodeReport, export_failure
from ..units import fmt_count
from .context import CONV_CATEGORIES, RuleContext
from .guidelines import RELEVANT_SHARE

_SHOW = 10  # examples listed in a finding's evidence


def _where(nodes: list[NodeReport]) -> str:
    first = nodes[0].module or nodes[0].name
    return first if len(nodes) == 1 else f"{first} (+{len(nodes) - 1})"


def conv_bn_pairs(ctx: RuleContext) -> list[tuple[NodeReport, NodeReport, NodeReport | None]]:
    """(conv or linear, batch norm, activation after it or None) for every batch norm that reads a
    conv/linear output nothing else reads: the norms ``archscan fuse`` folds."""
    g, pairs = ctx.graph, []
    for n in ctx.report.nodes:
        is_batch_norm = "BatchNorm" in n.module_type or any("batch_norm" in op for op in n.aten_ops)
        if n.category != "norm" or not is_batch_norm:
            continue
        if len(n.inputs) != 1:
            continue
        src = g.nodes[n.inputs[0]]["node"]
        if src.category in ("conv", "grouped_conv", "depthwise_conv", "linear") and g.out_degree(src.name) == 1:
            users = list(g.successors(n.name))
            act = g.nodes[users[0]]["node"] if len(users) == 1 else None
            pairs.append((src, n, act if act is not None and act.category == "activation" else None))
    return pairs


def check_fuse_conv_bn(ctx: RuleContext) -> list[Finding]:
    """Conv/linear whose only user is a batch norm: fold the norm into the weights for inference."""
    pairs = conv_bn_pairs(ctx)
    if not pairs:
        return []
    saved = sum(bn.mac_bytes for _, bn, _ in pairs)
    with_act = sum(1 for *_, a in pairs if a is not None)
    return [Finding(
        rule="fuse-conv-bn", severity="warning", module=_where([c for c, _, _ in pairs]),
        message=(f"{len(pairs)} conv/linear + batch-norm pairs can be folded for inference"
                 + (f" ({with_act} followed by an activation that can fuse too)" if with_act else "")),
        evidence={"pairs": [{"conv": c.name, "norm": b.name, "activation": a.name if a else None}
                            for c, b, a in pairs[:_SHOW]], "count": len(pairs)},
        saving={"mac_bytes": saved, "kernels": len(pairs), "params": sum(b.params for _, b, _ in pairs)},
        fix=("fold BN into the conv weights: `archscan fuse` writes the folded model as a .pt2 "
             "(torch.nn.utils.fusion.fuse_conv_bn_eval does one pair)" if export_failure(ctx.report) is None else
             "fold BN into the conv weights with torch.nn.utils.fusion.fuse_conv_bn_eval, pair by pair, in the "
             "model's code (`archscan fuse` needs torch.export, which failed on this model)"),
        source=pairs[0][1].source,
    )]


_SYNC_OPS = {"Tensor.item", "Tensor.tolist", "Tensor.numpy", "Tensor.cpu"}


# ops whose result the host holds by contract: reading it makes no device wait (a PackedSequence's
# batch_sizes, which nn.LSTM reads with batch_sizes[0])
_HOST_RESULT_OPS = ("aten._pack_padded_sequence",)
# ops that take an argument on the host: given a device tensor, they copy it there first (a sync;
# pack_padded_sequence moves its lengths to the CPU)
_HOST_ARGUMENT_OPS = ("aten._pack_padded_sequence",)
_VIEW_OPS = ("aten.select", "aten.slice", "aten.view", "aten._unsafe_view", "aten.reshape", "aten.alias",
             "aten.squeeze", "aten.unsqueeze", "aten.detach")


def _reads_host_tensor(n: NodeReport, by_name: dict) -> bool:
    """Does this value read (``.item()``, ``_local_scalar_dense``) come from a tensor the host holds
    by contract, through views?"""
    todo, seen = list(n.inputs), set()
    while todo:
        name = todo.pop()
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        src = by_name[name]
        if src.op.startswith(_HOST_RESULT_OPS):
            return True
        if src.op.startswith(_VIEW_OPS):
            todo.extend(src.inputs)
    return False


def check_host_sync(ctx: RuleContext) -> list[Finding]:
    """Ops that make the host wait for the device: .item(), .tolist(), nonzero(), .cpu(), tensor-valued
    branches: graph nodes, and the Python-level calls the capture saw but its graph does not keep."""
    by_name = {n.name: n for n in ctx.report.nodes}
    syncs = [n for n in ctx.report.nodes
             if ((n.category == "host_sync" or n.op in _SYNC_OPS or n.attrs.get("to_host"))
                 and not _reads_host_tensor(n, by_name)) or n.op in _HOST_ARGUMENT_OPS]
    if not syncs and not ctx.report.host_syncs:
        return []
    by_line: dict[str, list[NodeReport]] = defaultdict(list)
    for n in syncs:
        by_line[n.source or n.name].append(n)
    calls: dict[str, dict[str, int]] = defaultdict(dict)  # line -> op -> count
    for call in ctx.report.host_syncs:
        calls[call["source"]][call["op"]] = call["count"]
    notes = [note for note in ctx.report.capture_notes if "fx failed" in note or "export failed" in note]
    # a sync is why a capture failed only where the failure names its line (export and the fake run
    # say where the model needed a tensor's value): another sync on another line is not the cause
    caused = {line for line in list(by_line) + list(calls) if any(line in note for note in notes)}
    by_ops: dict[tuple[str, ...], list[str]] = defaultdict(list)  # the same ops on several lines: one finding
    for line in list(by_line) + [line for line in calls if line not in by_line]:
        by_ops[tuple(sorted({n.op for n in by_line.get(line, [])} | set(calls.get(line, {}))))].append(line)
    findings = []
    for ops, lines in by_ops.items():
        nodes = [n for line in lines for n in by_line.get(line, [])]
        findings.append(Finding(
            rule="host-sync", severity="warning", module=_where(nodes) if nodes else _where_lines(lines),
            message=f"host-device synchronisation in forward{f' at {len(lines)} places' if len(lines) > 1 else ''}: "
                    f"{', '.join(ops)}"
                    + ("; pack_padded_sequence copies its lengths to the host (keep them there: "
                       "lengths.cpu() once, outside forward)" if any(o.startswith(_HOST_ARGUMENT_OPS) for o in ops) else "")
                    + (" (also why the graph could not be captured)" if caused & set(lines) else ""),
            evidence={"nodes": [n.name for n in nodes[:_SHOW]], "ops": list(ops),
                      "capture": notes if caused & set(lines) else [],
                      "at": lines[:_SHOW], "places": len(lines)},
            saving={"syncs": sum(max(len(by_line.get(line, [])), sum(calls.get(line, {}).values())) for line in lines)},
            fix="keep the value on the device (torch.where, masks, fixed-size outputs), batch the syncs, "
                "or move the check out of the hot path",
            source=by_line[lines[0]][0].source if lines[0] in by_line else lines[0],
        ))
    return findings


def _where_lines(lines: list[str]) -> str:
    return lines[0] if len(lines) == 1 else f"{lines[0]} (+{len(lines) - 1})"


def check_host_tensor(ctx: RuleContext) -> list[Finding]:
    """Tensors created on the host, or moved with .to()/.cuda(), inside forward.

    Not host tensors: fx constants computed from the model's parameters and buffers (views of a
    ``relative_position_index`` buffer) and ``torch.tensor(..., device=...)`` calls; both are told
    apart when the report is built (``archscan.analysis``). A ``torch.tensor`` call that export records
    without showing its source line (made in a helper below forward) is noted as ``info``.
    """
    findings = []
    made = [n for n in ctx.report.nodes if n.attrs.get("host_factory")]
    consts = list(ctx.report.host_constants)
    if made or consts:
        where = [c["source"] or c["consumer"] for c in consts] + [n.attrs.get("made_at") or n.source or n.name
                                                                  for n in made]
        by_name = {n.name: n for n in ctx.report.nodes}
        owners = [by_name[c["consumer"]].module for c in consts if c["consumer"] in by_name] + [n.module for n in made]
        findings.append(Finding(
            rule="host-tensor", severity="warning", module=next((o for o in owners if o), "(root)"),
            message=f"{len(made) + len(consts)} tensor(s) created on the host inside forward",
            evidence={"at": sorted(set(where))[:_SHOW], "constants": [c["name"] for c in consts][:_SHOW]},
            saving={"copies": len(made) + len(consts)},
            fix="register them as buffers in __init__ (register_buffer), or create them with device=x.device",
            source=(consts[0]["source"] if consts else made[0].attrs.get("made_at") or made[0].source),
        ))
    unchecked = [n for n in ctx.report.nodes if n.attrs.get("host_factory_unchecked")]
    if unchecked:
        findings.append(Finding(
            rule="host-tensor", severity="info", module=_where(unchecked),
            message=(f"{len(unchecked)} torch.tensor(...) call(s) inside forward whose device= could not be "
                     "checked: the capture does not show the line that makes them"),
            evidence={"nodes": [n.name for n in unchecked[:_SHOW]],
                      "called_from": sorted({n.source or n.name for n in unchecked})[:_SHOW]},
            saving={"copies": len(unchecked)},
            fix="make sure the helpers called there pass device=x.device (or register the tensors as buffers)",
            source=unchecked[0].source,
        ))
    moved = [n for n in ctx.report.nodes if n.attrs.get("device_move") and not n.attrs.get("to_host")]
    if moved:
        findings.append(Finding(
            rule="host-tensor", severity="info", module=_where(moved),
            message=f"{len(moved)} .to(device)/.cuda() call(s) inside forward",
            evidence={"nodes": [n.name for n in moved[:_SHOW]], "at": sorted({n.source or n.name for n in moved})[:_SHOW]},
            saving={"copies": len(moved), "mac_bytes": sum(n.mac_bytes for n in moved)},
            fix="create tensors on the right device once (buffers, device=...), not per call",
            source=moved[0].source,
        ))
    return findings


def check_unused_module(ctx: RuleContext) -> list[Finding]:
    """Registered modules and parameters forward does not touch for these inputs (another input,
    an optional argument or the other mode may use them: the finding says so)."""
    r = ctx.report
    if not r.unused_param_names:
        return []
    each = r.totals.param_bytes / max(1, r.totals.params)
    dead = [m for m in r.modules if m.path and m.params and m.unused_params == m.params]
    dead_paths = [m.path for m in dead]
    tops = [m for m in dead if not any(m.path.startswith(p + ".") for p in dead_paths)]
    covered = {n for n in r.unused_param_names if any(n.startswith(m.path + ".") for m in tops)}
    loose = sorted(set(r.unused_param_names) - covered)
    findings = [Finding(
        rule="unused-module", severity="warning", module=m.path,
        message=f"{m.type} {m.path!r} is not used in forward for these inputs ({m.params:,} parameters)",
        evidence={"parameters": sorted(n for n in r.unused_param_names if n.startswith(m.path + "."))[:_SHOW]},
        saving={"params": m.params, "bytes": round(m.params * each)},
        fix="if no other input, argument or mode uses it, delete it (it is allocated, saved and loaded); "
            "else scan with the inputs that do",
    ) for m in tops]
    if loose:
        count = r.totals.unused_params - sum(m.params for m in tops)
        findings.append(Finding(
            rule="unused-module", severity="warning", module=loose[0].rsplit(".", 1)[0] if "." in loose[0] else "",
            message=f"parameters not used in forward for these inputs: {', '.join(loose[:_SHOW])}",
            evidence={"parameters": loose[:_SHOW]}, saving={"params": count, "bytes": round(count * each)},
            fix="if no other input, argument or mode uses them, delete them; else scan with the inputs that do",
        ))
    return findings


def elementwise_links(ctx: RuleContext) -> list[tuple[NodeReport, NodeReport]]:
    """(producer, consumer) pairs of out-of-place element-wise ops where the consumer is the only
    reader of the producer's output: a temporary a fused kernel would never write."""
    g, links = ctx.graph, []
    elementwise = ("elementwise", "activation", "norm")
    for n in ctx.report.nodes:
        if n.category not in ("elementwise", "activation") or len(n.inputs) < 1:
            continue
        if any(op.split(".")[1].endswith("_") for op in n.aten_ops if op.count(".") >= 2):
            continue  # already in place: aten.relu_.default
        for src_name in n.inputs:
            src = g.nodes[src_name]["node"]
            if src.category in elementwise and g.out_degree(src_name) == 1:
                links.append((src, n))
                break
    return links


def check_inplace(ctx: RuleContext) -> list[Finding]:
    """Chains of out-of-place element-wise ops: each writes a tensor the next reads once."""
    links = elementwise_links(ctx)
    if not links:
        return []
    saved = sum(2 * src.write_bytes for src, _ in links)
    return [Finding(
        rule="inplace", severity="info", module=_where([n for _, n in links]),
        message=f"{len(links)} out-of-place element-wise op(s) consume a temporary only they read",
        evidence={"chains": [f"{a.name} -> {b.name}" for a, b in links[:_SHOW]], "count": len(links)},
        saving={"mac_bytes": saved},
        fix="fuse the chain (torch.compile) or use in-place ops (relu_, add_, nn.ReLU(inplace=True)) where autograd allows",
        source=links[0][1].source,
    )]


def check_low_precision(ctx: RuleContext) -> list[Finding]:
    """fp32 matmul/conv work that bf16/fp16 would halve in bytes (and speed up on tensor cores). A
    layer whose weight is quantized already (``weight_dtype``: torch.ao, torchao) is not fp32 work:
    its weight is read at its int8 (int4, float8) bytes."""
    r = ctx.report
    fp32 = [n for n in r.nodes if n.dtype == "float32" and not n.attrs.get("weight_dtype")]
    if not fp32 or not any(n.flops for n in fp32):
        return []
    fp32_bytes = sum(n.mac_bytes for n in fp32)
    evidence = {"dtype": r.dtype, "float32_mac_bytes": fp32_bytes, "share_of_mac": round(fp32_bytes / r.totals.mac_bytes, 4)}
    fix = "run under torch.autocast('cuda', dtype=torch.bfloat16) (or .half()); quantize to int8 for inference"
    image = [i for i in r.inputs if i["dtype"] == "float32" and len(i["shape"]) == 4 and i["shape"][1] in (1, 3)]
    if image:
        evidence["image_input"] = image[0]["shape"]
        fix += "; ship images as uint8 and normalise on the device (4x fewer bytes to transfer)"
    return [Finding(
        rule="low-precision", severity="info", module="",
        message=f"the model runs in float32: {100 * fp32_bytes / r.totals.mac_bytes:.0f}% of its bytes would halve in bf16/fp16",
        evidence=evidence, saving={"mac_bytes": fp32_bytes // 2}, fix=fix,
    )]


ALIGN = {"float16": 8, "bfloat16": 8, "float32": 8, "int8": 16, "uint8": 16}
ALIGN_MIN_SHARE = 0.01  # the misaligned layers' share of the FLOPs below which aligning them cannot pay


def check_channel_align(ctx: RuleContext) -> list[Finding]:
    """Tensor cores want channel counts that are multiples of 8 (fp16/bf16) or 16 (int8).

    Counted where aligning can pay: not an RGB stem's 1-4 input channels, nor a router's output
    (one column per expert), nor a layer doing under 0.1% of the FLOPs, and the layers together
    doing at least 1%. An output head's width is the task's: it is padded, not rounded.
    """
    r = ctx.report
    bad = []
    for n in r.nodes:
        at = n.attrs
        if n.category in ("conv", "linear") and at.get("groups", 1) == 1:
            c_in = at.get("in_channels", at.get("in_features"))
            c_out = at.get("out_channels", at.get("out_features"))
            if c_in is None or c_out is None or n.flops < RELEVANT_SHARE * r.totals.flops:
                continue
            m = ALIGN.get(n.dtype or "float32", 8)
            off = [c for c, fixed in ((c_in, c_in <= 4), (c_out, ctx.routes_experts(n))) if c % m and not fixed]
            if off:
                bad.append((n, c_in, c_out, m))
    share = sum(n.flops for n, *_ in bad) / r.totals.flops if r.totals.flops else 0.0
    if not bad or share < ALIGN_MIN_SHARE:
        return []
    heads = [n.name for n, _, c_out, m in bad if c_out % m and ctx.makes_the_output(n)]
    return [Finding(
        rule="channel-align", severity="warning" if share >= 0.25 else "info", module=_where([n for n, *_ in bad]),
        message=f"{len(bad)} conv/linear layer(s) with channel counts not a multiple of {bad[0][3]} "
                f"({100 * share:.0f}% of FLOPs)",
        evidence={"layers": [{"node": n.name, "in": ci, "out": co} for n, ci, co, _ in bad[:_SHOW]],
                  "count": len(bad), "flops_share": round(share, 4), "output_heads": heads[:_SHOW]},
        saving={"flops_share": round(share, 4)},
        fix="round channel counts up to a multiple of 8 (16 for int8), e.g. timm's make_divisible"
            + ("; an output head's width is the task's (classes, anchors, a vocabulary): pad its weight with "
               "zero rows and slice its output" if heads else ""),
        source=bad[0][0].source,
    )]


def check_channels_last(ctx: RuleContext) -> list[Finding]:
    """Networks of 2-D convs run faster in channels_last memory format on tensor cores. It is a format
    of 4-D tensors: 1-D convs (over a sequence, a signal) have none, 3-D convs have channels_last_3d."""
    r = ctx.report
    conv = sum(n.flops for n in r.nodes if n.category in CONV_CATEGORIES and len(n.out_shape or ()) == 4)
    if not r.totals.flops or conv / r.totals.flops < 0.5:
        return []
    sweep = (r.latency or {}).get("sweep") or {}
    if "channels_last_ms" in sweep:  # measured both ways: say what it did
        base, cl = r.latency["end_to_end_ms"], sweep["channels_last_ms"]
        if cl >= 0.95 * base:
            return []
        return [Finding(
            rule="channels-last", severity="warning", module="",
            message=f"channels_last runs this model in {cl:.3f} ms against {base:.3f} ms ({base / cl:.2f}x faster)",
            evidence={"default_ms": base, "channels_last_ms": cl, "device": r.latency["device"]},
            saving={"latency_ms": base - cl},
            fix="model.to(memory_format=torch.channels_last) and the same for 4-D inputs",
        )]
    return [Finding(
        rule="channels-last", severity="info", module="",
        message=f"convolutions are {100 * conv / r.totals.flops:.0f}% of the FLOPs: try channels_last with "
                "cudnn.benchmark on a GPU",
        evidence={"conv_flops_share": round(conv / r.totals.flops, 4)},
        saving={},
        fix="model.to(memory_format=torch.channels_last), inputs too; torch.backends.cudnn.benchmark = True; "
            "measure both with archscan --measure --channels-last",
    )]


def check_no_grad(ctx: RuleContext) -> list[Finding]:
    """A module handed over in train mode: inference should run in eval() under inference_mode()."""
    if not ctx.report.training:
        return []
    return [Finding(
        rule="no-grad", severity="warning", module="",
        message="the module was in train mode (archscan analysed it in eval mode)",
        evidence={"training": True}, saving={},
        fix="call model.eval() and run inference under torch.inference_mode()",
    )]


def check_batch_size(ctx: RuleContext) -> list[Finding]:
    """Measured throughput at growing batch sizes (--measure --sweep): where does it saturate?"""
    batches = [b for b in ((ctx.report.latency or {}).get("sweep") or {}).get("batches", []) if "per_s" in b]
    if len(batches) < 2:
        return []
    first, best = batches[0], max(batches, key=lambda b: b["per_s"])
    gain = best["per_s"] / first["per_s"]
    if gain < 1.25:
        return []
    saturates = next((b["batch"] for prev, b in zip(batches, batches[1:]) if b["per_s"] < 1.1 * prev["per_s"]), None)
    return [Finding(
        rule="batch-size", severity="info", module="",
        message=(f"throughput grows {gain:.1f}x from batch {first['batch']} to {best['batch']}"
                 + (f"; it stops growing past batch {saturates}" if saturates else "; still growing at the largest batch tried")),
        evidence={"batches": batches},
        saving={"throughput_gain": round(gain, 2)},
        fix=f"serve or evaluate in batches of about {best['batch']} where latency allows",
    )]


def check_input_transfer(ctx: RuleContext) -> list[Finding]:
    """Host-to-device input copies (--measure --sweep on a GPU): pinned memory and smaller dtypes."""
    copies = ((ctx.report.latency or {}).get("sweep") or {}).get("input_copies") or []
    pageable = sum(c["pageable_ms"] for c in copies)
    pinned = sum(c["pinned_ms"] for c in copies)
    if not copies or pinned >= 0.8 * pageable:
        return []
    return [Finding(
        rule="input-transfer", severity="info", module="",
        message=f"copying the inputs to the device takes {pageable:.3f} ms from pageable memory, {pinned:.3f} ms pinned",
        evidence={"copies": copies},
        saving={"latency_ms": pageable - pinned},
        fix="DataLoader(pin_memory=True) and .to(device, non_blocking=True); ship images as uint8 and normalise on the device",
    )]


def check_decode_context(ctx: RuleContext) -> list[Finding]:
    """--decode: weights multiplied over every cached token, each step. A model that caches a
    compressed KV (multi-head latent attention) and re-expands all of it every step as written
    costs a multiple of what serving kernels spend, which keep the cache compressed."""
    decode = (ctx.report.phases or {}).get("decode") or {}
    gemms = decode.get("context_gemms")
    if not gemms:
        return []
    rest = decode["flops"] - gemms["flops"]
    at = gemms["at"]
    modules = gemms["modules"]
    return [Finding(
        rule="decode-context", severity="warning" if gemms["flops"] > rest else "info",
        module=(modules[0] or "(model)") + (f" (+{len(modules) - 1})" if len(modules) > 1 else ""),
        message=(f"each decode step multiplies weights over all {gemms['rows']:,} cached tokens, as written: "
                 f"{fmt_count(gemms['flops'])} multiply-adds per step in {gemms['ops']} GEMM(s), against "
                 f"{fmt_count(rest)} for the rest of the step ({gemms['flops'] / max(rest, 1):.1f}x), growing with "
                 "the context: a compressed KV cache re-expanded every step"),
        evidence={"context_flops": gemms["flops"], "rest_flops": rest, "context": decode["context"], "at": at,
                  "modules": modules[:10]},
        saving={"flops": gemms["flops"]},
        fix=("keep the cache compressed at decode: fold these weights into the query and output projections "
             "(absorbed multi-head latent attention, as serving kernels do: almost all of it goes), or cache "
             "what they produce"),
        source=at[0] if at else None,
    )]


def check_dense_experts(ctx: RuleContext) -> list[Finding]:
    """A mixture of experts whose code runs every expert on every token (the router's top-k only
    scales their outputs, most by zero): E/k times the multiply-adds routing needs."""
    dense = [n for n in ctx.report.nodes if "dense_experts" in n.attrs and n.flops]
    if not dense:
        return []
    flops = sum(n.flops for n in dense)
    routed = sum(n.attrs["routed_flops"] for n in dense)
    e, k = dense[0].attrs["dense_experts"], dense[0].attrs["experts_per_token"]
    return [Finding(
        rule="dense-experts", severity="warning", module=_where(dense),
        message=(f"every expert runs on every token as written: {fmt_count(flops)} multiply-adds in {len(dense)} expert "
                 f"GEMM(s) where routing {k} of {e} experts per token needs {fmt_count(routed)} "
                 f"({flops / max(routed, 1):.1f}x; {100 * flops / max(ctx.report.totals.flops, 1):.0f}% of the model's)"),
        evidence={"expert_flops": flops, "routed_flops": routed, "experts": e, "experts_per_token": k,
                  "gemms": [n.name for n in dense[:_SHOW]]},
        saving={"flops": flops - routed},
        fix=("send each token to its k experts only: sort the routed rows by expert and run one grouped GEMM "
             "(torch._grouped_mm, as Hugging Face's grouped_mm experts implementation does), or serve with a "
             "MoE kernel (vLLM, SGLang)"),
        source=dense[0].source,
    )]
