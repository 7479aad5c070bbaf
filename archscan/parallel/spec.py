"""``--parallel SPEC``: how a training step is spread over GPUs, read from the command line's words.

A spec names the degree of each way of parallelism, comma-separated, outermost first, as a device
mesh's dimensions: ``fsdp=8`` (FSDP2, parameters resharded after forward; ``fsdp=8:zero2`` keeps
them unsharded from forward to backward), ``ddp=4`` (DistributedDataParallel; ``ddp=4:bucket=50``
sets its ``bucket_cap_mb``), ``tp=8`` (tensor parallel with sequence-parallel norms), ``dp=2,fsdp=4`` (HSDP: replicated over 2 groups of 4
shards), ``fsdp=8,tp=8`` (2-D, 64 ranks). ``auto:N`` asks archscan to search the meshes of N GPUs.
Pure Python: no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ArchscanError

KINDS = ("dp", "ddp", "fsdp", "tp")  # in a mesh, outermost first
HINT = "e.g. fsdp=8, fsdp=8:zero2, ddp=4, tp=4, fsdp=8,tp=8, dp=2,fsdp=4, or auto:64"


@dataclass(frozen=True)
class ParallelSpec:
    """Degrees of each kind (1 where not used), FSDP's resharding, or a search over ``auto`` GPUs."""

    dp: int = 1    # replicas of an FSDP-sharded model (HSDP's replicate dimension)
    ddp: int = 1
    fsdp: int = 1
    tp: int = 1
    zero2: bool = False  # FSDP keeps parameters unsharded between forward and backward
    bucket_mb: float | None = None  # DDP's bucket_cap_mb (None: its default, 25 MiB after a first bucket of 1 MiB)
    auto: int = 0        # search the meshes of this many GPUs

    @classmethod
    def parse(cls, text: str) -> ParallelSpec:
        """``fsdp=8,tp=8`` → ParallelSpec(fsdp=8, tp=8); one clear error for anything else."""
        words = (text or "").strip()
        if not words:
            raise ArchscanError("--parallel needs a spec", hint=HINT)
        if words.startswith("auto"):
            _, _, count = words.partition(":")
            if not count.isdigit() or int(count) < 1:
                raise ArchscanError(f"--parallel {text!r}: auto needs a number of GPUs", hint="e.g. auto:64")
            return cls(auto=int(count))
        seen: dict[str, int] = {}
        zero2, bucket_mb = False, None
        for part in words.split(","):
            name, eq, value = part.strip().partition("=")
            value, _, flag = value.partition(":")
            if name not in KINDS or not eq:
                raise ArchscanError(f"--parallel {text!r}: {part.strip()!r} is not KIND=N (KIND: {', '.join(KINDS)})",
                                    hint=HINT)
            if name in seen:
                raise ArchscanError(f"--parallel {text!r} names {name} twice", hint=HINT)
            if not value.isdigit() or int(value) < 1:
                raise ArchscanError(f"--parallel {text!r}: {name} needs a whole number of ranks ≥ 1, not {value!r}",
                                    hint=HINT)
            if flag and name == "ddp" and flag.startswith("bucket="):
                try:
                    bucket_mb = float(flag.removeprefix("bucket="))
                except ValueError:
                    bucket_mb = 0.0
                if not bucket_mb > 0:
                    raise ArchscanError(f"--parallel {text!r}: ddp's bucket needs a size in MiB > 0", hint="e.g. ddp=8:bucket=50")
            elif flag and (name != "fsdp" or flag != "zero2"):
                raise ArchscanError(f"--parallel {text!r}: unknown option {flag!r} for {name}",
                                    hint="fsdp=N:zero2 and ddp=N:bucket=MiB are the options")
            zero2 |= flag == "zero2"
            seen[name] = int(value)
        if "ddp" in seen and ("fsdp" in seen or "dp" in seen):
            raise ArchscanError(f"--parallel {text!r}: ddp replicates the whole model; with FSDP use dp=N,fsdp=M (HSDP)",
                                hint=HINT)
        if "ddp" in seen and "tp" in seen:
            raise ArchscanError(f"--parallel {text!r}: DDP is modelled on the single-device step, not over tensor parallelism",
                                hint="use fsdp=N,tp=M for data parallelism beside tp")
        if "dp" in seen and "fsdp" not in seen:
            raise ArchscanError(f"--parallel {text!r}: dp=N replicates FSDP shards (HSDP) and needs fsdp=M beside it",
                                hint="for plain data parallelism use ddp=N")
        order = [k for k in (p.strip().partition("=")[0] for p in words.split(","))]
        expected = [k for k in KINDS if k in seen]
        if order != expected:
            raise ArchscanError(f"--parallel {text!r}: name the mesh outermost first ({','.join(expected)})",
                                hint="data parallelism spans nodes, tensor parallelism stays inside one")
        return cls(**seen, zero2=zero2, bucket_mb=bucket_mb)

    @property
    def world_size(self) -> int:
        return self.auto or self.dp * self.ddp * self.fsdp * self.tp

    @property
    def mesh(self) -> dict[str, int]:
        """The device mesh's dimensions, outermost first: name → size (only those used)."""
        return {k: getattr(self, k) for k in KINDS if getattr(self, k) > 1} or {"fsdp": self.fsdp}

    @property
    def data_parallel(self) -> int:
        """How many ranks see different data (each feeds its own micro-batch)."""
        return self.dp * self.ddp * self.fsdp

    def __str__(self) -> str:
        if self.auto:
            return f"auto:{self.auto}"
        flags = {"fsdp": ":zero2" if self.zero2 else "", "ddp": f":bucket={self.bucket_mb:g}" if self.bucket_mb is not None else ""}
        return ",".join(f"{k}={v}{flags.get(k, '')}" for k, v in self.mesh.items())

    def to_json(self) -> dict:
        return {"spec": str(self), "mesh": self.mesh, "world_size": self.world_size,
                "data_parallel": self.data_parallel, "reshard_after_forward": not self.zero2}


def meshes(gpus: int, tp_limit: int = 8) -> list[ParallelSpec]:
    """Every mesh of ``gpus`` ranks ``auto`` considers: FSDP over all, HSDP (dp × fsdp), DDP, and
    each of those with tensor parallelism of a power of two up to ``tp_limit`` (one node's GPUs)."""
    out: list[ParallelSpec] = []
    for tp in (t for t in (1, 2, 4, 8, 16) if t <= tp_limit and gpus % t == 0):
        rest = gpus // tp
        out.append(ParallelSpec(fsdp=rest, tp=tp) if rest > 1 or tp == 1 else ParallelSpec(tp=tp))
        if rest > 1:
            out.append(ParallelSpec(fsdp=rest, tp=tp, zero2=True))
            if tp == 1:
                out.append(ParallelSpec(ddp=rest))
        for dp in (d for d in range(2, rest) if rest % d == 0 and math.log2(d).is_integer()):
            out.append(ParallelSpec(dp=dp, fsdp=rest // dp, tp=tp))
    return out
