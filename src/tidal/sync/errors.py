"""Errors of weight sync that a user can cause and fix (a bad upstream, a missing version, a
corrupt transfer that no upstream can repair, a full disk)."""

from __future__ import annotations

import errno
from pathlib import Path

from tidal.errors import UserError


class SyncError(UserError, RuntimeError):
    """Weight sync cannot complete; the message names the upstream, version or file to fix."""


class VerificationError(SyncError):
    """Bytes that do not match their manifest (a chunk checksum or a tensor's digest)."""


def disk_full_error(err: OSError, where: Path) -> SyncError:
    """One clear message for a full disk (the most common write failure), else the OS's words."""
    if err.errno == errno.ENOSPC:
        return SyncError(f"no space left on the device holding {where}: free some space or point "
                         "the command at another folder; nothing half-written was left behind")
    return SyncError(f"cannot write under {where}: {err}")
