"""Every file archscan writes goes through ``write_file``: reports, Markdown, memory snapshots,
saved programs (``.pt2``) and device profiles.

The contents go to a temporary file in the target's own directory, which is flushed, synced and
renamed over the target. A write that fails halfway (a full disk, ``ulimit -f``, an exception)
or is interrupted (SIGINT, SIGTERM, SIGHUP) removes the temporary file and leaves an earlier file
at the path whole; the error is one ``ArchscanError`` line naming the path (exit 2), a signal
ends as ``KeyboardInterrupt`` or ``errors.Terminated``. The new file gets the permissions a plain
``open(path, "w")`` would give it: an existing file's mode, or ``0o666`` less the umask.

A target that exists and is not a regular file (``/dev/stdout``, a FIFO) is written directly:
nothing can be renamed over it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import tempfile
import threading
from typing import BinaryIO, Callable

from .errors import ArchscanError, Terminated

PARTIAL_PREFIX = ".archscan-partial-"
_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


def check_writable(path: str | os.PathLike, what: str = "") -> tuple[str, os.stat_result | None]:
    """Refuse, with one line naming ``path``, an output that cannot be written: no name, a
    directory, a missing or unwritable directory, an existing file ``open()`` would refuse. The
    command line calls it before any analysis; ``write_file`` again when it writes. Returns the
    real path (a link followed, as ``open()`` follows it) and its ``os.stat`` (None when new)."""
    path = os.fspath(path)
    label = f"{what} {path}".strip()
    if not path.strip():
        raise ArchscanError(f"cannot write {what or 'the output'}: no file name given", hint="give a file path")
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _error(label, exc) from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise ArchscanError(f"cannot write {label}: it is a directory", hint="give a file name")
    if st is not None and not stat.S_ISREG(st.st_mode):
        return real, st  # /dev/stdout, a FIFO: written directly
    parent = os.path.dirname(real)
    if not os.path.isdir(parent):
        raise ArchscanError(f"cannot write {label}: no directory {os.path.dirname(os.path.abspath(path))}",
                            hint="create it, or pick another path")
    # open() refuses a read-only file; a rename over it would not, so it is asked here
    if not os.access(parent, os.W_OK) or (st is not None and not os.access(real, os.W_OK)):
        raise ArchscanError(f"cannot write {label}: permission denied", hint="choose a writable path")
    return real, st


def write_file(path: str | os.PathLike, contents: str | bytes | Callable[[BinaryIO], None], what: str = "") -> str:
    """Write ``contents`` (text as UTF-8, bytes, or a function that writes to a binary file) to
    ``path`` whole or not at all; returns the path written. ``what`` names the output in errors
    (``"--report"``)."""
    path = os.fspath(path)
    label = f"{what} {path}".strip()
    real, st = check_writable(path, what)
    if st is not None and not stat.S_ISREG(st.st_mode):
        return _write_direct(real, contents, label)
    parent = os.path.dirname(real)
    mode = stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask()
    temporary = None
    with _signals_noted() as pending:
        try:
            fd, temporary = tempfile.mkstemp(prefix=PARTIAL_PREFIX, suffix=os.path.splitext(real)[1], dir=parent)
            with os.fdopen(fd, "wb") as fh:
                _put(fh, contents)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(temporary, mode)
            if pending:  # an interrupt that a finaliser swallowed: the file must not land
                raise _signal_exception(pending[0])
            os.replace(temporary, real)
            temporary = None
        except OSError as exc:
            raise _error(label, exc) from None
        finally:
            if temporary is not None:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
    _sync_directory(parent)
    return path


def _put(fh: BinaryIO, contents: str | bytes | Callable[[BinaryIO], None]) -> None:
    if isinstance(contents, str):
        fh.write(contents.encode("utf-8"))
    elif isinstance(contents, (bytes, bytearray, memoryview)):
        fh.write(contents)
    else:
        contents(fh)


def _write_direct(path: str, contents, label: str) -> str:
    try:
        with open(path, "wb") as fh:
            _put(fh, contents)
    except OSError as exc:
        raise _error(label, exc) from None
    return path


_HINTS = {"ENOSPC": "free some disk space", "EFBIG": "the file size limit (ulimit -f) is too small",
          "EROFS": "choose a path on a writable file system", "EACCES": "choose a writable path",
          "EPERM": "choose a writable path", "EDQUOT": "free some of your disk quota"}


def _error(label: str, exc: OSError) -> ArchscanError:
    hint = _HINTS.get(errno.errorcode.get(exc.errno or 0, ""), "nothing was written there")
    return ArchscanError(f"cannot write {label}: {exc.strerror or exc}", hint=hint)


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (setting it to read it
    races with other threads creating files)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _sync_directory(directory: str) -> None:
    """The rename on disk too (a crash right after it keeps the new file, not none)."""
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _signal_exception(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


@contextlib.contextmanager
def _signals_noted():
    """While a file is written (main thread only: Python delivers signals there): SIGINT,
    SIGTERM and SIGHUP raise as usual, and are noted, so that one raised inside a finaliser
    (where Python prints it and goes on) still stops the rename."""
    pending: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield pending
        return

    def note(signum, frame):
        pending.append(signum)
        raise _signal_exception(signum)

    previous = {}
    try:
        for sig in _SIGNALS:
            if signal.getsignal(sig) not in (signal.SIG_IGN, None):  # keep what the caller ignores ignored
                previous[sig] = signal.signal(sig, note)
        yield pending
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
