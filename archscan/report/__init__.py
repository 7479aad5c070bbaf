"""Rendering reports: terminal tables, JSON, Markdown. Pure functions over ``Report``."""

from .text import fmt_bytes, fmt_count, module_table, node_table, render_text, totals_lines

__all__ = ["fmt_bytes", "fmt_count", "module_table", "node_table", "render_text", "totals_lines"]
