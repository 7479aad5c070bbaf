"""A world of ranks in one process: torch.distributed's fake process group and a device mesh.

The fake backend (``torch.testing._internal.distributed.fake_pg``) answers every collective at
once without moving data, so torch.distributed's own code (FSDP2's ``fully_shard``, tensor
parallel's ``parallelize_module``, DTensor) runs as rank ``rank`` of ``world_size`` would, with
every allocation and every collective it makes. Only one process group can exist in a process:
a caller's own is refused rather than replaced.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist

from ..errors import ArchscanError
from .spec import ParallelSpec


@contextlib.contextmanager
def fake_world(spec: ParallelSpec, rank: int = 0) -> Iterator:
    """The device mesh of ``spec`` (CPU, names from ``spec.mesh``) in a fake process group of
    ``spec.world_size`` ranks seen from ``rank``; the group is destroyed on the way out."""
    if not dist.is_available():
        raise ArchscanError("this torch build has no torch.distributed", hint="--parallel needs it")
    if dist.is_initialized():
        raise ArchscanError("a torch.distributed process group already exists in this process",
                            hint="run archscan --parallel outside a distributed job (it makes its own fake one)")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    forget_meshes()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=spec.world_size)
    try:
        names = tuple(spec.mesh)
        yield init_device_mesh("cpu", tuple(spec.mesh.values()), mesh_dim_names=names)
    finally:
        dist.destroy_process_group()
        forget_meshes()


def forget_meshes() -> None:
    """Clear DTensor's caches of sharding decisions and redistribution plans: they hold device
    meshes, which compare equal across worlds of the same shape, so a later world would run its
    collectives on an earlier world's process groups (gone with it)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import _redistribute

    propagator = DTensor._op_dispatcher.sharding_propagator
    for cached in (getattr(_redistribute, "_gen_transform_infos", None),
                   getattr(propagator, "propagate_op_sharding", None),
                   getattr(type(propagator), "_propagate_tensor_meta", None)):
        clear = getattr(cached, "cache_clear", None)
        if clear is not None:
            clear()
    planners = getattr(_redistribute, "_planner_cache", None)
    if isinstance(planners, dict):
        planners.clear()
    fast_path = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)  # DTensor's C++ dispatch
    if fast_path is not None:
        fast_path()


def group_of(pg) -> tuple[int | None, str | None]:
    """(size, name) of the process group a collective names: a c10d op's boxed ``ScriptObject``
    or a functional collective's group name; (None, None) where it cannot be read."""
    try:
        if isinstance(pg, str):
            from torch.distributed.distributed_c10d import _resolve_process_group
            group = _resolve_process_group(pg)
        else:
            group = dist.ProcessGroup.unbox(pg)
        return group.size(), group.group_name
    except Exception:
        return None, None


def mesh_groups(mesh) -> dict[str, str]:
    """Process group name -> the mesh dimension it runs along."""
    return {mesh.get_group(d).group_name: d for d in mesh.mesh_dim_names}
