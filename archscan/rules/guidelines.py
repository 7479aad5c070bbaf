"""The four ShuffleNetV2 guidelines (Ma et al., ECCV 2018), quantified.

G1 equal channel width minimizes MAC; G2 excessive group convolution increases MAC;
G3 network fragmentation reduces parallelism; G4 element-wise operations are non-negligible.
MACs here are in elements (the paper's unit) unless a name says bytes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from functools import cache

import torch

from ..costs import category_of
from ..graph import ELEMENTWISE_CATEGORIES, elementwise_mac_bytes, is_elementwise
from ..results import Finding, NodeReport
from .context import CONV_CATEGORIES, RuleContext, dtype_size

G1_MIN_RATIO = 1.05      # the paper's 1:2 row (MAC x1.053 of the 1:1 row) already runs 12% slower on GPU
G2_MIN_RATIO = 1.05
RELEVANT_SHARE = 0.001   # ignore layers whose excess is under 0.1% of the model's MAC (channel-align: its FLOPs)


def _hw(shape) -> int:
    return math.prod(shape[2:]) if shape and len(shape) > 2 else 1


def conv_mac_terms(n: NodeReport) -> tuple[int, int, int, int, int, int]:
    """(a, b, c1, c2, k, g): MAC = a*c1 + b*c2 + k*c1*c2/g elements (a, b: input/output map sizes)."""
    at = n.attrs
    a = _hw(at.get("in_shape")) * (at["in_shape"][0] if at.get("in_shape") else 1)
    b = _hw(n.out_shape) * (n.out_shape[0] if n.out_shape else 1)
    k = math.prod(at["kernel"]) if at.get("kernel") else 1
    return a, b, at["in_channels"], at["out_channels"], k, at["groups"]


def conv_mac_elements(a: int, b: int, c1: int, c2: int, k: int, g: int) -> float:
    """Eq. 1/2 generalised: feature maps in + out, plus weights."""
    return a * c1 + b * c2 + k * c1 * c2 / g


def g1_lower_bound(a: int, b: int, c1: int, c2: int, k: int, g: int) -> float:
    """The least MAC at the same FLOPs, over c1, c2 with c1*c2 fixed: 2*sqrt(a*b*c1*c2) + k*c1*c2/g.

    For a 1x1 conv (a = b = hw) this is Eq. 1: MAC >= 2*sqrt(hw*B) + B/hw.
    """
    return 2 * math.sqrt(a * b * c1 * c2) + k * c1 * c2 / g


def g2_reference(a: int, b: int, c1: int, c2: int, k: int, g: int) -> float:
    """MAC of the g=1 layer with the same input and FLOPs (c2 -> c2/g), Eq. 2's comparison."""
    return a * c1 + b * c2 / g + k * c1 * (c2 / g)


def image_convs(ctx: RuleContext) -> list[NodeReport]:
    """The convs the guidelines speak of: over an image's (or a signal's) map, as in the paper's
    networks; not transposed convs, nor a sequence model's 1-D conv over its tokens."""
    return [n for n in ctx.report.nodes if n.category in CONV_CATEGORIES and "in_channels" in n.attrs
            and not n.attrs.get("transposed") and not ctx.over_tokens(n)]


def _balance(c1: int, c2: int) -> str:
    """128, 768 -> '1:6'; 768, 128 -> '6:1'."""
    return f"1:{c2 / c1:.3g}" if c2 >= c1 else f"{c1 / c2:.3g}:1"


def check_g1(ctx: RuleContext) -> list[Finding]:
    """G1: MAC of each ungrouped conv against the lower bound at the same FLOPs, where balancing the
    channels is the fix: input and output maps of one size (the paper's setting), and channel
    counts the task does not fix (the data's channels into the stem, the output head's: classes,
    anchors x 4 box coordinates, RGB)."""
    findings = []
    total_mac = ctx.report.totals.mac_bytes or 1
    for n in image_convs(ctx):
        if n.attrs["groups"] != 1 or n.attrs["in_channels"] <= 4 or n.attrs["out_channels"] <= 4:
            continue  # grouped convs are G2's; 1-4 channels in (an image) or out (classes, RGB) are fixed by the task
        stem, head = ctx.reads_the_data(n), ctx.makes_the_output(n)
        if (stem or head) and not (stem and head):  # a model of this one layer is a probe of it: checked
            continue  # the data fixes a stem's input width, the task a head's output width (anchors x 4 boxes)
        terms = conv_mac_terms(n)
        if terms[0] != terms[1]:
            continue  # a strided (or unpadded) conv: its maps differ in size, and channel balance is not the fix
        mac, bound = conv_mac_elements(*terms), g1_lower_bound(*terms)
        ratio = mac / bound
        excess = (mac - bound) * dtype_size(n.dtype)
        if ratio < G1_MIN_RATIO or excess < RELEVANT_SHARE * total_mac:
            continue
        _, _, c1, c2, _, _ = terms
        findings.append(Finding(
            rule="G1", severity="warning" if ratio >= 1.25 else "info", module=n.module or n.name,
            message=f"{c1}->{c2} channels ({_balance(c1, c2)}): MAC is {ratio:.2f}x the least at these FLOPs",
            evidence={"node": n.name, "block": ctx.block_of(n.name), "in_channels": c1, "out_channels": c2,
                      "mac_elements": round(mac),
                      "lower_bound_elements": round(bound), "ratio": round(ratio, 3)},
            saving={"mac_bytes": round(excess), "share_of_model_mac": round(excess / total_mac, 4)},
            fix="balance input and output channels (G1); e.g. a narrower expansion or a wider input",
            source=n.source,
        ))
    return findings


def check_g2(ctx: RuleContext) -> list[Finding]:
    """G2: grouped (and depthwise) image convs against the g=1 layer of the same FLOPs (a sequence
    model's depthwise conv1d over its tokens is not one: ``RuleContext.over_tokens``)."""
    findings = []
    total_mac = ctx.report.totals.mac_bytes or 1
    for n in image_convs(ctx):
        terms = conv_mac_terms(n)
        g = terms[5]
        if g == 1:
            continue
        mac, ref = conv_mac_elements(*terms), g2_reference(*terms)
        ratio = mac / ref
        extra = (mac - ref) * dtype_size(n.dtype)
        if ratio < G2_MIN_RATIO or extra < RELEVANT_SHARE * total_mac:
            continue
        depthwise = n.category == "depthwise_conv"
        findings.append(Finding(
            rule="G2", severity="info" if depthwise or ratio < 1.25 else "warning", module=n.module or n.name,
            message=(f"{'depthwise' if depthwise else f'{g}-group'} conv: MAC is {ratio:.2f}x that of a "
                     f"dense conv with the same FLOPs"),
            evidence={"node": n.name, "block": ctx.block_of(n.name), "groups": g, "in_channels": terms[2],
                      "out_channels": terms[3],
                      "mac_elements": round(mac), "dense_equal_flops_elements": round(ref), "ratio": round(ratio, 3)},
            saving={"mac_bytes": round(extra), "share_of_model_mac": round(extra / total_mac, 4)},
            fix=("fewer groups (G2): use a group count the target platform handles well, e.g. dense 1x1 "
                 "convs with a channel split as in ShuffleNetV2" if not depthwise else
                 "depthwise convs trade FLOPs for MAC; keep them few and wide (ShuffleNetV2 uses one per unit)"),
            source=n.source,
        ))
    return findings


def check_g3(ctx: RuleContext) -> list[Finding]:
    """G3: fragmented operators (convs and pools) per building block, grouped by block shape. Not in
    a sequence model's blocks: their 1-D convs over the tokens (a Conformer's three) sit among
    linear layers the count leaves out."""
    groups: dict[tuple, list] = defaultdict(list)
    for b in ctx.blocks:
        if b.fragments >= 2 and not any(ctx.over_tokens(ctx.graph.nodes[name]["node"]) for name in b.nodes):
            groups[b.signature].append(b)
    findings = []
    for (type_, fragments, series, parallel), blocks in groups.items():
        severity = "warning" if fragments >= 5 or parallel >= 3 else "info"
        names = [b.name for b in blocks]
        shape = f"{series} in series" + (f", {parallel} in parallel" if parallel > 1 else "")
        findings.append(Finding(
            rule="G3", severity=severity, module=names[0] if len(names) == 1 else f"{names[0]} (+{len(names) - 1})",
            message=f"{len(blocks)} {type_} block(s) with {fragments} fragmented ops each ({shape})",
            evidence={"blocks": names, "fragments": fragments, "series": series, "parallel": parallel,
                      "paper_reference": "NASNet-A 13 per block, ResNet 2-3"},
            saving={"kernels": (fragments - 1) * len(blocks)},
            fix=("fewer, larger operators per block (G3): merge parallel branches into one wider conv, "
                 "or fuse small convs in series"),
        ))
    return findings


@cache
def _op_category(op: str) -> str:
    """The cost registry's category of an op named like 'aten.add.Tensor' ('other' when unknown)."""
    namespace, _, rest = op.partition(".")
    name, _, overload = rest.partition(".")
    try:
        return category_of(getattr(getattr(getattr(torch.ops, namespace), name), overload or "default"))
    except (AttributeError, RuntimeError):
        return "other"


def elementwise_kernels(n: NodeReport) -> tuple[int, int]:
    """(element-wise kernels, kernels) of a node: its ops that read or write data (not views, not
    allocations), each of the node's category, or its own where the node is a whole torch.nn layer."""
    cats = [_op_category(op) for op in n.aten_ops]
    if not n.attrs.get("mac_by_category"):
        cats = [n.category if c not in ("view", "factory") else c for c in cats]
    work = [c for c in cats if c not in ("view", "factory")]
    return sum(1 for c in work if c in ELEMENTWISE_CATEGORIES or c == "depthwise_conv"), len(work)


def elementwise_shares(ctx: RuleContext) -> dict:
    t = ctx.report.totals
    mac = sum(elementwise_mac_bytes(n) for n in ctx.report.nodes)
    flops = sum(n.flops for n in ctx.report.nodes if is_elementwise(n))
    counts = [elementwise_kernels(n) for n in ctx.report.nodes]
    elementwise, kernels = sum(e for e, _ in counts), sum(k for _, k in counts)
    return {"mac_bytes": mac, "mac_share": mac / t.mac_bytes if t.mac_bytes else 0.0,
            "flops": flops, "flops_share": flops / t.flops if t.flops else 0.0,
            "kernels": elementwise, "kernel_share": elementwise / kernels if kernels else 0.0}


G4_MIN_SHARE = 0.2


def _g4_message(s: dict) -> str:
    """Bytes and kernels against FLOPs. Element-wise ops count no FLOPs (multiply-adds) by
    convention; only depthwise convs, element-wise work to the paper, bring some."""
    kernels = f" and launch {100 * s['kernel_share']:.0f}% of the kernels" if s["kernels"] else ""
    if s["flops"]:
        return (f"element-wise ops move {100 * s['mac_share']:.0f}% of the bytes{kernels} for "
                f"{100 * s['flops_share']:.1f}% of the FLOPs (their depthwise convs)")
    return f"element-wise ops move {100 * s['mac_share']:.0f}% of the bytes{kernels}; FLOPs (multiply-adds) count none of it"


def check_g4(ctx: RuleContext) -> list[Finding]:
    """G4: share of element-wise work (ReLU, add, bias, norms, depthwise conv) in MAC and in kernels,
    against its share of FLOPs."""
    s = elementwise_shares(ctx)
    if s["mac_share"] < G4_MIN_SHARE:
        return []
    top = sorted(ctx.blocks, key=lambda b: b.elementwise_mac_bytes, reverse=True)[:5]
    by_cat: dict[str, int] = defaultdict(int)
    for n in ctx.report.nodes:
        for cat, nbytes in (n.attrs.get("mac_by_category") or {n.category: n.mac_bytes}).items():
            if cat in ELEMENTWISE_CATEGORIES or cat == "depthwise_conv":
                by_cat[cat] += nbytes
    return [Finding(
        rule="G4", severity="warning" if s["mac_share"] >= 0.4 else "info", module="",
        message=_g4_message(s),
        evidence={"mac_share": round(s["mac_share"], 4), "flops_share": round(s["flops_share"], 4),
                  "kernel_share": round(s["kernel_share"], 4), "elementwise_kernels": s["kernels"],
                  "elementwise_mac_bytes": s["mac_bytes"], "by_category_bytes": dict(by_cat),
                  "top_blocks": [{"block": b.name, "mac_share": round(b.elementwise_mac_bytes / b.mac_bytes, 4)
                                  if b.mac_bytes else 0.0} for b in top]},
        saving={"mac_bytes": s["mac_bytes"] - sum(v for k, v in by_cat.items() if k == "depthwise_conv")},
        fix=("fuse element-wise ops into their producers (conv+bn+relu folding, torch.compile), drop "
             "ReLUs/shortcuts that do not pay for themselves (G4)"),
    )]


__all__ = ["check_g1", "check_g2", "check_g3", "check_g4", "conv_mac_terms", "g1_lower_bound", "g2_reference",
           "image_convs"]
