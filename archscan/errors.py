"""The one exception type archscan raises for problems a user can fix."""

from __future__ import annotations


class ArchscanError(Exception):
    """A problem with the user's model, input spec or environment.

    The CLI prints `str(error)` as one line on stderr and exits with `exit_code`.
    """

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base} ({self.hint})" if self.hint else base


class CaptureError(ArchscanError):
    """The model could not be captured or run at all."""

    exit_code = 3


class DeviceError(ArchscanError):
    """A device is missing, out of memory or failed."""

    exit_code = 4
