"""Rendering reports: terminal tables, JSON, Markdown. Pure functions over ``Report``."""

from .text import findings_table, fmt_bytes, fmt_count, fmt_saving, module_table, node_table, render_text, totals_lines

__all__ = ["findings_table", "fmt_saving", "fmt_bytes", "fmt_count", "module_table", "node_table", "render_text", "totals_lines"]
