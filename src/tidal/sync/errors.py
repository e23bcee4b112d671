"""Errors of weight sync that a user can cause and fix (a bad upstream, a missing version, a
corrupt transfer that no upstream can repair, a full disk)."""

from tidal.errors import UserError


class SyncError(UserError, RuntimeError):
    """Weight sync cannot complete; the message names the upstream, version or file to fix."""


class VerificationError(SyncError):
    """Bytes that do not match their manifest (a chunk checksum or a tensor's digest)."""
