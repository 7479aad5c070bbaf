"""Hand-written attention in a report: ``matmul -> [scale] -> [mask] -> softmax -> [dropout] -> matmul``.

The report-level twin of ``archscan.transform.attention`` (which proves the match on the exported
graph before rewriting): here the chain is found on the report's node graph to estimate what
``F.scaled_dot_product_attention`` would save. Every intermediate holds the [..., L, S] score
matrix, written once and read once by the next op; a fused attention kernel keeps it on chip.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..results import NodeReport
from ..rules.context import RuleContext

_SOFTMAX = ("aten._softmax", "aten.softmax", "aten._safe_softmax")
_PASS_THROUGH = ("aten.dropout", "aten.native_dropout", "aten._to_copy", "aten.clone")


@dataclass(frozen=True)
class AttentionPattern:
    module: str
    first: NodeReport                 # q @ k^T
    elementwise: tuple[NodeReport, ...]  # scale, mask, softmax, dropout, casts: the ops SDPA absorbs
    last: NodeReport                  # p @ v
    scores_bytes: int
    scores_shape: str

    @property
    def round_trips(self) -> int:
        return len(self.elementwise) + 1

    @property
    def mac_bytes(self) -> int:
        """Each intermediate score tensor written once and read once."""
        return 2 * (self.first.write_bytes + sum(n.write_bytes for n in self.elementwise))

    @property
    def kernels_saved(self) -> int:
        """Two matmuls and the kernels between them become one kernel."""
        return sum(1 for n in self.elementwise if n.category != "view") + 1


def _is_softmax(n: NodeReport) -> bool:
    return any(op.startswith(_SOFTMAX) for op in n.aten_ops)


def _is_matmul(n: NodeReport) -> bool:
    return n.category == "matmul" and n.flops > 0


def attention_patterns(ctx: RuleContext) -> list[AttentionPattern]:
    """Every softmax that sits between two matmuls through single-reader element-wise ops."""
    g = ctx.graph
    node = lambda name: g.nodes[name]["node"]  # noqa: E731
    found = []
    for sm in ctx.report.nodes:
        if not _is_softmax(sm) or sm.out_shape is None:
            continue
        chain_after: list[NodeReport] = []
        cur = sm
        while True:
            succ = list(g.successors(cur.name))
            if len(succ) != 1:
                break
            nxt = node(succ[0])
            passes = nxt.category == "view" or any(op.startswith(_PASS_THROUGH) for op in nxt.aten_ops)
            if passes and nxt.out_shape == sm.out_shape:  # inactive dropout, same-dtype .to()
                chain_after.append(nxt)
                cur = nxt
                continue
            break
        succ = list(g.successors(cur.name))
        if len(succ) != 1 or not _is_matmul(node(succ[0])):
            continue
        last = node(succ[0])
        chain_before: list[NodeReport] = []
        cur, first = sm, None
        while True:
            preds = [node(p) for p in g.predecessors(cur.name)]
            scores = [p for p in preds if p.out_shape == sm.out_shape and g.out_degree(p.name) == 1]
            mm = [p for p in scores if _is_matmul(p)]
            if mm:
                first = mm[0]
                break
            step = [p for p in scores if p.category in ("elementwise", "activation")]
            if len(step) != 1 or len(chain_before) >= 4:
                break
            chain_before.append(step[0])
            cur = step[0]
        if first is None:
            continue
        elementwise = tuple(reversed(chain_before)) + (sm,) + tuple(chain_after)
        found.append(AttentionPattern(sm.module or sm.name, first, elementwise, last, sm.write_bytes,
                                      "×".join(map(str, sm.out_shape))))
    return found
