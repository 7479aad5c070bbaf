"""Transforms of a real-weights model, verified against the original and saved with ``torch.export``."""

from .fuse import FuseResult, output_path, fuse, program_totals
from .verify import Check, compare

__all__ = ["Check", "FuseResult", "compare", "output_path", "fuse", "program_totals"]
