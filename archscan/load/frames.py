"""Which code is the model's: telling the user's frames from torch's, archscan's and Python's own.

Findings and errors point at the model's ``file.py:LINE``. A frame is the model's unless its file
lies inside torch, archscan, Python's standard library or the command-line stack archscan runs
on (typer, click, rich). Directories are compared with a trailing separator, so
``site-packages/torchvision/...`` is model code and not torch's.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from functools import lru_cache

from ..errors import CaptureError

_ARCHSCAN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # archscan/, this file in archscan/load/
_NOT_MODEL_PACKAGES = ("torch", "typer", "click", "rich", "tabulate", "networkx", "_pytest", "pluggy")


@lru_cache(maxsize=1)
def _stdlib_dirs() -> tuple[str, ...]:
    paths = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib")}
    return tuple(os.path.abspath(p) + os.sep for p in paths if p)


_seen = [-1, ()]  # len(sys.modules) when the directories were last looked up, and them


def _package_dirs() -> tuple[str, ...]:
    """Directories of the non-model packages already imported (never imports one)."""
    if _seen[0] != len(sys.modules):  # a module came (or went) since: look again
        _seen[:] = [len(sys.modules), _dirs_of(tuple(name for name in _NOT_MODEL_PACKAGES if name in sys.modules))]
    return _seen[1]


@lru_cache(maxsize=None)
def _dirs_of(imported: tuple[str, ...]) -> tuple[str, ...]:
    dirs = [_ARCHSCAN_DIR + os.sep]
    for name in imported:
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            dirs.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    return tuple(dirs)


def is_user_file(fname: str) -> bool:
    """Model code, as opposed to torch's, archscan's, the standard library's or generated code."""
    if not fname or fname.startswith("<"):
        return False
    return _is_user_path(fname, _package_dirs())


@lru_cache(maxsize=4096)
def _is_user_path(fname: str, package_dirs: tuple[str, ...]) -> bool:
    path = os.path.abspath(fname)
    if path.startswith(package_dirs):
        return False
    # site-packages lives under the standard library's prefix on some layouts: it is not stdlib
    in_stdlib = path.startswith(_stdlib_dirs()) and f"{os.sep}site-packages{os.sep}" not in path \
        and f"{os.sep}dist-packages{os.sep}" not in path
    return not in_stdlib


def user_frame(exc: BaseException, prefer_file: str | None = None) -> str | None:
    """'file.py:LINE' of the innermost traceback frame in model code (in ``prefer_file`` when one
    is there), or None when the exception never passed through model code."""
    frames = traceback.extract_tb(exc.__traceback__)
    preferred = [fr for fr in frames if prefer_file and os.path.abspath(fr.filename) == prefer_file]
    user = [fr for fr in frames if is_user_file(fr.filename)]
    best = (preferred or user or [None])[-1]
    return where(best.filename, best.lineno) if best is not None else None


def where(fname: str, lineno: int | None) -> str:
    """'file.py:LINE', relative to the working directory when the file is below it."""
    fname = _shown_path(fname, os.getcwd())
    return f"{fname}:{lineno}" if lineno is not None else fname


@lru_cache(maxsize=4096)
def _shown_path(fname: str, cwd: str) -> str:  # a report names a few files on every node
    try:
        rel = os.path.relpath(fname, cwd)
        return rel if not rel.startswith("..") else fname
    except ValueError:  # another drive on Windows
        return fname


def at(exc: BaseException, prefer_file: str | None = None) -> str:
    """' at file.py:LINE' for an error message, or '' when no model frame is known."""
    loc = user_frame(exc, prefer_file)
    return f" at {loc}" if loc else ""


def short(exc: BaseException) -> str:
    """'TypeName: first line of the message'."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


def exit_error(exc: SystemExit, activity: str, prefer_file: str | None = None, said: str = "") -> CaptureError:
    """A ``sys.exit()`` in the model's code (at import, in its constructor or forward) as an error:
    archscan must not end quietly, with the model's exit code, as if the analysis had passed."""
    code = exc.code
    argparse_exit = any(os.path.basename(fr.filename) == "argparse.py" for fr in traceback.extract_tb(exc.__traceback__))
    if argparse_exit:
        last = [line for line in said.strip().splitlines() if line.strip()]
        detail = f" ({last[-1].strip()})" if last else ""
        return CaptureError(
            f"{activity}: the model's code parses command-line arguments and exited{at(exc, prefer_file)}{detail}",
            hint="archscan passes it none; move argument parsing under `if __name__ == '__main__':`")
    return CaptureError(f"{activity}: the model's code called sys.exit({code!r}){at(exc, prefer_file)}",
                        hint="archscan cannot analyse a model that exits; remove the call or guard it")
