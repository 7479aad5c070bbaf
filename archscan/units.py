"""Numbers as people read them: counts with SI prefixes, bytes with binary ones."""

from __future__ import annotations


def fmt_count(n: float | int | None, unit: str = "") -> str:
    """1234567 -> '1.23M' (SI prefixes, three significant digits)."""
    return "-" if n is None else _prefixed(float(n), ((1, ""), (1e3, "K"), (1e6, "M"), (1e9, "G"), (1e12, "T")), unit)


def fmt_bytes(n: float | int | None) -> str:
    """Bytes with binary prefixes: 1536 -> '1.5 KiB'."""
    return "-" if n is None else _prefixed(float(n), ((1, " B"), (2**10, " KiB"), (2**20, " MiB"), (2**30, " GiB"),
                                                      (2**40, " TiB")))


def _prefixed(n: float, prefixes: tuple, unit: str = "") -> str:
    """``n`` in the smallest prefix that shows it in three significant digits without an exponent."""
    for div, suffix in prefixes:
        text = f"{n / div:.3g}"
        if "e+" not in text:  # 1011 KiB would read '1.01e+03 KiB': '0.987 MiB' instead
            break
    return f"{text}{suffix}{unit}"
