"""Per-op costs: FLOPs (multiply-adds), element ops and bytes moved.

Takes an aten op with its arguments and result (shapes, dtypes); gives its ``OpCost``. Modules:
``registry`` (one formula per op, refusing duplicates), ``kernels`` (fused kernels' costs),
``quantized`` (models already quantized: torch.ao's packed weights, tensor subclasses' stored bytes). The
category names every report uses are ``archscan.results.CATEGORIES``.
"""

from .registry import CATEGORIES, OpCost, category_of, cost_op, is_free, register_flops, storage_key, tensor_key
from .registry import MASK_ELEMENTS, bound_arguments, composite_attention, expected_experts, mask_pairs, topk_routing
from .registry import _tensors as tensors_in
from .registry import subclass_linear_costs
from .quantized import (activation_quantize, inner_named, inner_tensors, is_packed, packed, packed_attributes, packed_key, real_object, storage_id,
                        storages_nbytes, stored_nbytes)

__all__ = ["CATEGORIES", "OpCost", "category_of", "cost_op", "is_free", "register_flops", "storage_key", "tensor_key", "tensors_in",
           "MASK_ELEMENTS", "bound_arguments", "composite_attention", "expected_experts", "mask_pairs", "topk_routing", "subclass_linear_costs",
           "activation_quantize", "inner_named", "inner_tensors", "is_packed", "packed", "packed_attributes", "packed_key", "real_object", "storage_id",
           "storages_nbytes", "stored_nbytes"]
