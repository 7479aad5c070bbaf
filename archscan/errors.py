"""The one exception type archscan raises for problems a user can fix."""

from __future__ import annotations


class ArchscanError(Exception):
    """A problem with the user's model, input spec or environment.

    The CLI prints `str(error)` as one line on stderr and exits with `exit_code`:
    2 bad usage or input, 3 the model's code failed or could not be captured, 4 a device
    problem, 5 an internal error, 6 a transform that failed its check (1 is findings at
    ``--fail-on``, 130 an interrupt).
    """

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base} ({self.hint})" if self.hint else base


class CaptureError(ArchscanError):
    """The model's own code failed (import, constructor, forward, ``sys.exit``), or it could not
    be captured or run at all."""

    exit_code = 3


class DeviceError(ArchscanError):
    """A device is missing, out of memory or failed.

    When a measurement fails after the static analysis, ``report`` holds that analysis.
    """

    exit_code = 4
    report = None


class InternalError(ArchscanError):
    """A failure inside archscan itself: a bug to report."""

    exit_code = 5


class VerifyError(ArchscanError):
    """A transformed model's outputs differ from the original's beyond the tolerance: not saved.

    ``result`` holds what the transform did and measured.
    """

    exit_code = 6
    result = None


class Terminated(BaseException):
    """SIGTERM or SIGHUP while archscan runs (``archscan.files`` and the CLI raise it): like
    ``KeyboardInterrupt`` for SIGINT, it unwinds so that no partial output is left, and the
    command exits ``128 + signum`` with one line."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
