"""A parallel step's time on a named GPU and interconnect: compute from the GPU time model, each
collective from ``comm``'s model, and the step under a stated overlap.

- **Compute**: rank 0's own ops (``op_classes``) priced by ``archscan.measure.gpu.training_ms``,
  as written (eager: the slower of the GPU's kernels and the host's launches per phase).
- **Communication**: each recorded collective on its process group, which spans the nodes its
  mesh dimension spans (``comm.group_span``: the mesh is laid out row-major, tensor parallelism
  innermost, ``gpus_per_node`` consecutive ranks on a node).
- **Overlap**: FSDP2 prefetches the next block's all-gather while this block computes and
  reduce-scatters a block's gradients while the next one's backward runs; DDP all-reduces a bucket
  while the backward goes on. Those collectives (``c10d``'s and DDP's) can hide behind the same
  phase's compute. Tensor parallel's collectives (DTensor's ``_c10d_functional`` ones) sit between
  a layer's matmuls and wait for each other: they are exposed. The step is given two ways:
  ``overlapped`` (per phase: compute + exposed + what of the overlappable exceeds the compute)
  and ``serial`` (everything one after another), the bounds a real run falls between.
"""

from __future__ import annotations

from ..devices.gpus import GPU
from ..measure.gpu import training_ms
from .comm import Interconnect, collective_size, collective_time, group_span

# collectives the step's compute can hide: FSDP2's (c10d ops) and DDP's; DTensor's functional ones are exposed
OVERLAPPABLE = ("c10d.", "ddp.")


def step_time(step: dict, gpu: GPU, interconnect: Interconnect, mesh: dict[str, int]) -> dict | None:
    """The ``time`` of a ``parallel`` section: per phase compute, exposed and overlappable
    communication, and the step's time ``overlapped`` and ``serial``; the collectives' rows get
    their ``ms`` (all calls of the row) and the link they cross."""
    compute = training_ms(step, gpu)
    if compute is None:
        return None
    phases: dict[str, dict] = {p: {"compute_ms": v["predicted_ms"], "exposed_comm_ms": 0.0, "overlappable_comm_ms": 0.0}
                               for p, v in compute["phases"].items()}
    for row in step["collectives"]:
        dim = row["mesh_dim"]
        per_node = interconnect.gpus_per_node
        nodes = group_span(mesh, dim, per_node)[0] if dim in mesh else -(-row["group_size"] // per_node)
        size = collective_size(row["kind"], row["send_bytes"], row["recv_bytes"])
        one = collective_time(row["kind"], size, row["group_size"], interconnect, nodes)
        row["ms"] = one["seconds"] * 1e3 * row["count"]
        row["link"], row["algorithm"] = one["link"], one["algorithm"]
        phase = phases.setdefault(row["phase"], {"compute_ms": 0.0, "exposed_comm_ms": 0.0, "overlappable_comm_ms": 0.0})
        key = "overlappable_comm_ms" if row["op"].startswith(OVERLAPPABLE) else "exposed_comm_ms"
        phase[key] += row["ms"]
    overlapped = serial = 0.0
    for phase in phases.values():
        hidden = min(phase["overlappable_comm_ms"], phase["compute_ms"])
        phase["overlapped_ms"] = phase["compute_ms"] + phase["exposed_comm_ms"] + phase["overlappable_comm_ms"] - hidden
        phase["serial_ms"] = phase["compute_ms"] + phase["exposed_comm_ms"] + phase["overlappable_comm_ms"]
        overlapped += phase["overlapped_ms"]
        serial += phase["serial_ms"]
    comm = sum(p["exposed_comm_ms"] + p["overlappable_comm_ms"] for p in phases.values())
    return {"gpu": gpu.name, "interconnect": interconnect.name, "compute_ms": compute["predicted_ms"],
            "comm_ms": comm, "overlapped_ms": overlapped, "serial_ms": serial, "phases": phases,
            "assumes": "FSDP2's and DDP's collectives overlap the same phase's compute; tensor parallel's do not; "
                       "compute as written (eager)"}
