"""One rank of a real multi-process run (``torchrun``, the gloo backend on the CPU): the per-rank
peak ``tests/parallel_oracle.py`` measures, in a real process group, written to
``OUT/rank{N}.json``. ``tests/test_parallel.py`` launches it and compares every rank with
archscan's rank 0.

    python -m torch.distributed.run --nproc_per_node 4 tests/parallel_gloo.py zoo:llama_tiny \\
        "{'vocab_size': 1000}" fsdp=4 2,128:int64 OUT
"""

from __future__ import annotations

import ast
import json
import os
import sys

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from archscan.load.targets import parse_input_spec, to_target  # noqa: E402
from archscan.parallel.spec import ParallelSpec  # noqa: E402
from parallel_oracle import peak_in  # noqa: E402


# the collectives, whose allocations inside are gloo's own staging (NCCL stages in buffers of its own,
# outside the caching allocator)
GLOO_OPS = ("c10d::", "gloo:")


def main(target: str, kwargs: str, spec_text: str, shape: str, out: str) -> None:
    dist.init_process_group("gloo")
    try:
        spec = ParallelSpec.parse(spec_text)
        mesh = init_device_mesh("cpu", tuple(spec.mesh.values()), mesh_dim_names=tuple(spec.mesh))
        args = (mesh, to_target(target), [parse_input_spec(shape)], spec, ast.literal_eval(kwargs))
        peak, calls = peak_in(*args)
        model_only, _ = peak_in(*args, skip=GLOO_OPS)
        with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
            json.dump({"rank": dist.get_rank(), "peak_bytes": peak, "without_gloo_buffers": model_only,
                       "collectives": len(calls)}, f)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
