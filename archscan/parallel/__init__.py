"""Parallel: a training step spread over GPUs, as torch.distributed's own code runs it on fake tensors.

Takes a model target, one rank's micro-batch (``InputSpec``s), the step's ``TrainOptions`` and a
``ParallelSpec`` (``--parallel fsdp=8,tp=8``); gives the JSON ``parallel`` section: the plan
applied, rank 0's peak and its breakdown (sharded and unsharded parameters, FSDP2's all-gather and
reduce-scatter buffers, gradients, DDP's buckets, optimizer state, activations, temporaries),
every collective with its bytes per rank, and their times on a named interconnect.

Modules, in the order data flows: ``spec.py`` (the words of ``--parallel``, no torch),
``world.py`` (the fake process group and the device mesh), ``plans.py`` (FSDP2 and tensor-parallel
plans applied on the meta device, or the user's), ``step.py`` (the step on fake tensors, its
collectives), ``ddp.py`` (DistributedDataParallel's buckets, modelled on one device's step).
"""

from .spec import ParallelSpec

__all__ = ["ParallelSpec"]
