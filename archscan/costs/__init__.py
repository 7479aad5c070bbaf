"""Per-op costs: FLOPs (multiply-adds), element ops and bytes moved. See `registry`."""

from .registry import CATEGORIES, OpCost, category_of, cost_op, is_free, register_flops, storage_key, tensor_key

__all__ = ["CATEGORIES", "OpCost", "category_of", "cost_op", "is_free", "register_flops", "storage_key", "tensor_key"]
