"""Print what the CPU allocator sees inside one op: every allocation and free, in time order, under
the op that made it, and the op's scratch (its worst live bytes beyond its result) as the allocator
saw it. The numbers behind ``archscan/memory/scratch.py``.

    python benchmarks/probe_scratch.py conv 4,32,32,32 32,32,3,3 --dtype bf16 --groups 1
    python benchmarks/probe_scratch.py conv-backward 4,32,32,32 32,32,3,3 --dtype fp16
"""

from __future__ import annotations

import argparse

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def events(prof) -> list[tuple[int, int, str]]:
    """(time, bytes, enclosing op) of every CPU allocation (+) and free (-)."""
    out, stack = [], [(ev, "") for ev in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        ev, parent = stack.pop()
        name = parent if ev.tag == _EventType.Allocation else ev.name
        if ev.tag == _EventType.Allocation and str(ev.extra_fields.device) == "cpu":
            out.append((ev.start_time_ns, ev.extra_fields.alloc_size, parent))
        stack.extend((c, name) for c in ev.children)
    return sorted(out)


def probe(kind: str, x_shape, w_shape, dtype, groups: int, stride: int, padding: int) -> None:
    x = torch.randn(x_shape).to(dtype)
    w = torch.randn(w_shape).to(dtype)
    args = (x, w, None, [stride] * 2, [padding] * 2, [1] * 2, False, [0, 0], groups)
    y = torch.ops.aten.convolution(*args)
    go = torch.randn_like(y)

    def run():
        if kind == "conv":
            return torch.ops.aten.convolution(*args)
        return torch.ops.aten.convolution_backward(go, x, w, None, *args[3:], [True, True, False])

    run()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = run()
    results = sum(t.numel() * t.element_size() for t in (result if isinstance(result, tuple) else (result,))
                  if isinstance(t, torch.Tensor))
    live = peak = 0
    for _, size, op in events(prof):
        live += size
        peak = max(peak, live)
        print(f"{size:>+12,}  live {live:>12,}  {op}")
    print(f"results {results:,}  peak {peak:,}  scratch beyond the results {peak - results:,}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=["conv", "conv-backward"])
    parser.add_argument("x", help="input shape, N,C,H,W")
    parser.add_argument("weight", help="weight shape, Cout,Cin/groups,kH,kW")
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp32")
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--stride", type=int, default=1)
    parser.add_argument("--padding", type=int, default=1)
    a = parser.parse_args()
    shape = lambda s: [int(v) for v in s.split(",")]  # noqa: E731
    probe(a.kind, shape(a.x), shape(a.weight), DTYPES[a.dtype], a.groups, a.stride, a.padding)


if __name__ == "__main__":
    main()
