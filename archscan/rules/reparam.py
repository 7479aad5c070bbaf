"""Train-time multi-branch blocks that one convolution replaces at inference (structural
reparameterization: RepVGG, MobileOne, FastViT's RepMixer and stems).

Such a block sums parallel branches that all read the same tensor, each one layer deep: k×k
convolutions (each with or without a batch norm after it), a smaller centred convolution (1×1)
and an identity (with or without a batch norm). At inference the norms fold into the convolutions
and the branches add up into one k×k convolution with a bias, exactly (the identity is a k×k
kernel with a one in its centre). The model as built runs every branch; as deployed, one
convolution: its multiply-adds are the largest branch's, and it reads the input and writes the
output once.

``branch_sums`` finds them on the node graph: a tree of additions whose leaves each come, through
at most a convolution and a batch norm, from one tensor, with at least one convolution among them,
all of the same stride, groups and output shape. A residual block (its branch two convolutions
deep) is not one.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..results import Finding, NodeReport
from .context import RuleContext

_CONVS = ("conv", "grouped_conv", "depthwise_conv")


@dataclass(frozen=True)
class BranchSum:
    """One reparameterizable block: its nodes as built and the convolution that replaces them."""

    module: str                      # the innermost module holding every node of it
    source: str                      # the node whose output every branch reads
    nodes: tuple[NodeReport, ...]    # the branches' convolutions and norms, and the additions
    convs: tuple[NodeReport, ...]
    identity: bool                   # a branch is the input itself (or its batch norm)
    deployed: NodeReport             # the largest convolution: the deployed one's costs

    @property
    def built_flops(self) -> int:
        return sum(n.flops for n in self.nodes)

    @property
    def built_mac(self) -> int:
        return sum(n.mac_bytes for n in self.nodes)


_ADDS = ("operator.add", "operator.iadd", "add", "add_", "iadd", "aten.add.Tensor", "aten.add_.Tensor", "torch.add",
         "Tensor.add", "Tensor.add_")


def _is_add(n: NodeReport) -> bool:
    """An addition of two tensors, in place or not (timm's MobileOne blocks sum ``out += conv(x)``)."""
    return n.category == "elementwise" and (n.op in _ADDS or n.aten_ops in (("aten.add.Tensor",), ("aten.add_.Tensor",)))


def _is_identity(n: NodeReport) -> bool:
    """A node that passes its one input on unchanged (an ``nn.Identity``, or a dropout in eval)."""
    return len(n.inputs) == 1 and not n.aten_ops and n.category == "view" and n.flops == 0 \
        and (n.op in ("Identity", "Dropout") or n.module_type in ("Identity", "Dropout"))


def _is_batch_norm(n: NodeReport) -> bool:
    return n.category == "norm" and ("BatchNorm" in n.module_type or any("batch_norm" in op for op in n.aten_ops))


def _common(paths: list[str]) -> str:
    parts = [p.split(".") for p in paths]
    out = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        out.append(level[0])
    return ".".join(out)


def branch_sums(ctx: RuleContext) -> list[BranchSum]:
    g, found, used = ctx.graph, [], set()
    nodes = {n.name: n for n in ctx.report.nodes}

    def only_user(name: str) -> bool:
        return g.out_degree(name) == 1

    def through(name: str) -> str:
        """Past the identities a branch's output passes (timm's ``BatchNormAct2d`` ends in an
        ``Identity`` dropout and activation) and additions of a constant (timm's MobileOne starts
        its sum at ``0``; any constant folds into the deployed bias): the node that computes it."""
        m = nodes.get(name)
        while m is not None and (_is_identity(m) or (_is_add(m) and len(m.inputs) == 1)) and only_user(name):
            name = m.inputs[0]
            m = nodes.get(name)
        return name

    for n in reversed(ctx.report.nodes):  # the last addition of a tree first: it holds the whole tree
        if n.name in used or not _is_add(n) or len(n.inputs) != 2:
            continue
        adds, leaves, stack = [n], [], list(n.inputs)
        while stack:
            name = through(stack.pop())
            m = nodes.get(name)
            if m is not None and _is_add(m) and len(m.inputs) == 2 and only_user(name):
                adds.append(m)
                stack.extend(m.inputs)
            else:
                leaves.append(name)
        branches = []  # (source, conv or None, norm or None)
        for name in leaves:  # already past identities (``through``)
            m = nodes.get(name)
            conv = norm = None
            if m is not None and _is_batch_norm(m) and only_user(name) and len(m.inputs) == 1:
                name = through(m.inputs[0])
                norm, m = m, nodes.get(name)
            read = (m.inputs or [f"input {i}" for i in m.attrs.get("shared_inputs", ())]) if m is not None else []
            if m is not None and m.category in _CONVS and only_user(m.name) and len(read) == 1 \
                    and m.attrs.get("kernel") and not m.attrs.get("transposed"):
                conv, name = m, read[0]  # a model input several nodes read: by its name (a stem's branches)
            branches.append((name, conv, norm))
        sources = {s for s, _, _ in branches}
        convs = [c for _, c, _ in branches if c is not None]
        if len(branches) < 2 or len(sources) != 1 or not convs:
            continue
        source = sources.pop()
        shapes = {c.out_shape for c in convs} | {n.out_shape}
        if len(shapes) != 1 or len({(c.attrs.get("stride"), c.attrs.get("groups")) for c in convs}) != 1:
            continue
        kernels = [c.attrs["kernel"] for c in convs]
        if any(k[i] % 2 == 0 for k in kernels for i in range(len(k))):  # a centred smaller kernel needs odd sizes
            continue
        identity = any(c is None for _, c, _ in branches)
        if identity and (convs[0].attrs.get("stride") not in (None, (1,), (1, 1), (1, 1, 1))):
            continue
        members = [x for _, c, bn in branches for x in (c, bn) if x is not None] + adds
        used.update(a.name for a in adds)
        deployed = max(convs, key=lambda c: c.flops)
        found.append(BranchSum(_common([m.module for m in members]), source, tuple(members), tuple(convs),
                               identity, deployed))
    found.reverse()
    return found


def check_reparameterize(ctx: RuleContext) -> list[Finding]:
    """Multi-branch blocks that one convolution replaces at inference (see the module docstring)."""
    sums = branch_sums(ctx)
    if not sums:
        return []
    built_flops = sum(s.built_flops for s in sums)
    deployed_flops = sum(s.deployed.flops for s in sums)
    built_mac = sum(s.built_mac for s in sums)
    deployed_mac = sum(s.deployed.mac_bytes for s in sums)
    kernels = sum(len(s.nodes) - 1 for s in sums)
    total = ctx.report.totals.flops
    branches = max(len(s.convs) + s.identity for s in sums)
    as_deployed = total - built_flops + deployed_flops
    return [Finding(
        rule="reparameterize", severity="warning", module=", ".join(dict.fromkeys(s.module for s in sums[:3]))
        + (f" (+{len(sums) - 3})" if len(sums) > 3 else ""),
        message=(f"{len(sums)} train-time multi-branch block(s) (up to {branches} parallel branches of one layer "
                 f"each, summed) become one convolution each at inference: as deployed the model takes "
                 f"{as_deployed / total:.0%} of the multiply-adds counted as built"),
        evidence={"blocks": [{"module": s.module, "branches": len(s.convs) + s.identity, "identity": s.identity,
                              "built_flops": s.built_flops, "deployed_flops": s.deployed.flops,
                              "built_mac_bytes": s.built_mac, "deployed_mac_bytes": s.deployed.mac_bytes}
                             for s in sums[:20]],
                  "count": len(sums), "as_built_flops": total, "as_deployed_flops": as_deployed,
                  "as_deployed_mac_bytes": ctx.report.totals.mac_bytes - built_mac + deployed_mac},
        saving={"flops": built_flops - deployed_flops, "mac_bytes": built_mac - deployed_mac, "kernels": kernels},
        fix="reparameterize before inference or export: fold each branch's batch norm into its conv and add the "
            "kernels into one (timm: timm.utils.reparameterize_model(model); RepVGG/MobileOne code: each block's "
            "reparameterize() or switch_to_deploy())",
        source=sums[0].deployed.source,
    )]


__all__ = ["BranchSum", "branch_sums", "check_reparameterize"]
