"""Rules are data: one table of rule id -> check function; each returns ``Finding``s.

Ids are stable (shared/reference/tuning_rules.md): G1-G4 are the ShuffleNetV2 guidelines,
the rest the PyTorch tuning rules a captured model can show. Severities: info < warning < error.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

from ..errors import ArchscanError
from ..results import Finding, Report
from . import guidelines, hygiene, reparam
from .context import RuleContext

Check = Callable[[RuleContext], list[Finding]]

RULES: dict[str, Check] = {
    "G1": guidelines.check_g1,
    "G2": guidelines.check_g2,
    "G3": guidelines.check_g3,
    "G4": guidelines.check_g4,
    "fuse-conv-bn": hygiene.check_fuse_conv_bn,
    "reparameterize": reparam.check_reparameterize,
    "host-sync": hygiene.check_host_sync,
    "host-tensor": hygiene.check_host_tensor,
    "unused-module": hygiene.check_unused_module,
    "inplace": hygiene.check_inplace,
    "low-precision": hygiene.check_low_precision,
    "channel-align": hygiene.check_channel_align,
    "channels-last": hygiene.check_channels_last,
    "no-grad": hygiene.check_no_grad,
    "batch-size": hygiene.check_batch_size,          # needs --measure --sweep
    "input-transfer": hygiene.check_input_transfer,  # needs --measure --sweep on a GPU
    "decode-context": hygiene.check_decode_context,  # needs --decode
    "dense-experts": hygiene.check_dense_experts,
}

SEVERITIES = ("info", "warning", "error")


def select_rules(only: Iterable[str] | None = None, skip: Iterable[str] | None = None) -> list[str]:
    """Rule ids to run; unknown ids are an error that lists the known ones."""
    only, skip = list(only or []), list(skip or [])
    unknown = [r for r in only + skip if r not in RULES]
    if unknown:
        raise ArchscanError(f"unknown rule id(s): {', '.join(unknown)}", hint=f"known: {', '.join(RULES)}")
    return [r for r in (only or RULES) if r not in skip]


def run_rules(report: Report, rules: Iterable[str] | None = None, ctx: RuleContext | None = None) -> Report:
    """The report with ``findings`` filled in (most bytes saved first, within severity)."""
    ctx = ctx or RuleContext(report)
    findings: list[Finding] = []
    for rule_id in (list(rules) if rules is not None else list(RULES)):
        findings.extend(RULES[rule_id](ctx))
    findings.sort(key=lambda f: (-SEVERITIES.index(f.severity), -int(f.saving.get("mac_bytes", 0) or 0)))
    return dataclasses.replace(report, findings=tuple(findings))


def worst_severity(report: Report) -> str | None:
    """The highest severity among the findings, or None."""
    levels = [SEVERITIES.index(f.severity) for f in report.findings]
    return SEVERITIES[max(levels)] if levels else None


__all__ = ["RULES", "SEVERITIES", "RuleContext", "run_rules", "select_rules", "worst_severity"]
