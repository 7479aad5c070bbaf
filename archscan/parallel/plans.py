"""How a model is parallelized: torch.distributed's own ``parallelize_module`` and ``fully_shard``
applied to the model on the meta device, as a training script would apply them.

- **Tensor parallel** (``tp``): a plan per decoder family archscan knows (``PLANS``): attention's
  query, key and value projections and the MLP's up projections column-wise, the output
  projections row-wise, the norms sequence-parallel (the residual stream sharded on the sequence
  between blocks), the embedding row-wise and the output head column-wise with its logits left
  sharded on the vocabulary (Megatron-LM's layout, as torchtitan writes it for Llama).
- **FSDP2** (``fsdp``, HSDP with ``dp``): ``fully_shard`` on each block (every child with
  parameters of the model's ``ModuleList``/``Sequential`` containers: decoder layers, ResNet's
  bottlenecks, ViT's encoder blocks), then on the root; ``zero2`` keeps the blocks' parameters
  unsharded from forward to backward (``reshard_after_forward=False``). ``--amp bf16`` is FSDP2's
  mixed precision (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=float32)``, as torchtitan
  trains): parameters gathered and computed in bf16, gradients reduced in float32, no autocast.
- **A user's plan** (``--plan file.py:function``): ``function(model, mesh) -> model | None`` does
  all of it itself, with the whole device mesh (its dimensions named as in the spec).

Every parameter must end up a DTensor on a mesh that uses FSDP: one left a plain tensor is named
(``check_sharded``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..errors import ArchscanError, CaptureError
from ..load.frames import short
from .spec import ParallelSpec


def blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules FSDP2 wraps one by one: each child holding parameters (and submodules) of
    the outermost ``ModuleList``/``Sequential`` containers, in order."""
    found: list[tuple[str, nn.Module]] = []

    def visit(prefix: str, module: nn.Module) -> None:
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            if isinstance(child, (nn.ModuleList, nn.Sequential)):
                inner = [(f"{path}.{n}", c) for n, c in child.named_children()
                         if any(True for _ in c.children()) and any(True for _ in c.parameters())]
                if inner:
                    found.extend(inner)
                    continue
            visit(f"{path}.", child)

    visit("", model)
    return found


def shard(model: nn.Module, mesh, spec: ParallelSpec, param_dtype: torch.dtype | None = None) -> None:
    """FSDP2 on each block, then the root (HSDP over a ``dp`` × ``fsdp`` mesh); ``param_dtype``:
    mixed precision as FSDP2 does it (``MixedPrecisionPolicy``: parameters all-gathered and computed
    in it, gradients reduced in float32)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    fsdp_mesh = mesh["dp", "fsdp"] if spec.dp > 1 else mesh["fsdp"]
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else MixedPrecisionPolicy()
    for _, block in blocks(model):
        fully_shard(block, mesh=fsdp_mesh, reshard_after_forward=not spec.zero2, mp_policy=policy)
    fully_shard(model, mesh=fsdp_mesh, reshard_after_forward=not spec.zero2, mp_policy=policy)


def _divides(spec: ParallelSpec, what: str, count: int) -> None:
    if count % spec.tp:
        raise ArchscanError(f"tp={spec.tp} does not divide the model's {count} {what}",
                            hint=f"use a tensor-parallel degree that divides {count}")


def _llama(model: nn.Module, tp_mesh, spec: ParallelSpec) -> None:
    """archscan's zoo Llama (Meta's module names): torchtitan's plan for Llama."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    first = model.layers[0].attention
    _divides(spec, "attention heads", first.n_heads)
    _divides(spec, "key/value heads", first.n_kv_heads)
    parallelize_module(model, tp_mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=True),
    })
    for block in model.layers:
        parallelize_module(block, tp_mesh, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                            desired_input_layouts=(Replicate(), None, None)),
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        })
        block.attention.n_heads //= spec.tp  # each rank runs its own heads
        block.attention.n_kv_heads //= spec.tp


def _hf_decoder(model: nn.Module, tp_mesh, spec: ParallelSpec) -> None:
    """Hugging Face's Llama-family decoders (Llama, Mistral, Qwen2...: ``model.layers[i].self_attn.
    {q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``): the plan of transformers' own ``base_model_tp_plan``
    (column-wise projections, row-wise outputs), without sequence parallelism."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    config = model.config
    _divides(spec, "attention heads", config.num_attention_heads)
    _divides(spec, "key/value heads", getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    parallelize_module(model, tp_mesh, {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=True),
    })
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, {
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel(),
        })


def _is_zoo_llama(model: nn.Module) -> bool:
    layers = getattr(model, "layers", None)
    return (isinstance(layers, nn.ModuleList) and len(layers) > 0 and hasattr(model, "tok_embeddings")
            and hasattr(layers[0], "attention") and hasattr(layers[0].attention, "wq"))


def _is_hf_decoder(model: nn.Module) -> bool:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    return (hasattr(model, "config") and isinstance(layers, nn.ModuleList) and len(layers) > 0
            and all(hasattr(getattr(layers[0], "self_attn", None), p) for p in ("q_proj", "k_proj", "v_proj", "o_proj"))
            and all(hasattr(getattr(layers[0], "mlp", None), p) for p in ("gate_proj", "up_proj", "down_proj")))


PLANS: list[tuple[str, Callable[[nn.Module], bool], Callable]] = [
    ("Llama (Meta's layout)", _is_zoo_llama, _llama),
    ("Hugging Face Llama-family decoder", _is_hf_decoder, _hf_decoder),
]


def tensor_parallel(model: nn.Module, tp_mesh, spec: ParallelSpec) -> str:
    """Apply the default tensor-parallel plan of the model's family; returns the family's name."""
    for name, matches, apply in PLANS:
        if matches(model):
            apply(model, tp_mesh, spec)
            return name
    raise ArchscanError(f"archscan has no tensor-parallel plan for {type(model).__name__}",
                        hint="give your own with --plan file.py:function (function(model, mesh) -> model), "
                             "or use fsdp/ddp only")


def parallelize(model: nn.Module, mesh, spec: ParallelSpec, user_plan: Callable | None = None,
                plan_name: str | None = None, param_dtype: torch.dtype | None = None) -> tuple[nn.Module, str]:
    """``model`` (on the meta device) parallelized over ``mesh`` as ``spec`` says, or by the
    user's plan; returns the model and what plan was applied. ``param_dtype``: FSDP2's mixed
    precision (``shard``)."""
    if user_plan is not None:
        try:
            out = user_plan(model, mesh)
        except ArchscanError:
            raise
        except Exception as exc:
            raise CaptureError(f"the plan {plan_name or user_plan.__name__} raised {short(exc)}",
                               hint="it is called as function(model, mesh) with the model on the meta device") from exc
        model = out if isinstance(out, nn.Module) else model
        applied = f"user plan {plan_name or user_plan.__name__}"
    else:
        applied = []
        if spec.tp > 1:
            applied.append(f"tensor parallel: {tensor_parallel(model, mesh['tp'], spec)}")
        if spec.fsdp > 1 or spec.dp > 1:
            shard(model, mesh, spec, param_dtype)
            applied.append(f"FSDP2 on {len(blocks(model))} blocks and the root" + (" (zero2)" if spec.zero2 else "")
                           + (f", parameters in {str(param_dtype).removeprefix('torch.')} (MixedPrecisionPolicy), "
                              "gradients reduced in float32" if param_dtype else ""))
        applied = "; ".join(applied)
    check_sharded(model, spec)
    return model, applied


def check_sharded(model: nn.Module, spec: ParallelSpec) -> None:
    """Every parameter is a DTensor when FSDP shards the model: a plain one is a plan's mistake
    (under tensor parallelism alone a plain parameter is replicated, as norms are without
    sequence parallelism)."""
    if spec.fsdp * spec.dp == 1:
        return
    from torch.distributed.tensor import DTensor

    plain = [name for name, p in model.named_parameters() if not isinstance(p, DTensor)]
    if plain:
        more = f" and {len(plain) - 1} more" if len(plain) > 1 else ""
        raise ArchscanError(f"the plan leaves parameter {plain[0]}{more} unsharded (a plain tensor on every rank)",
                            hint="shard it (fully_shard on its module or its root, or a tensor-parallel style)")
