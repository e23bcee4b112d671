"""The one exception the sandbox raises: for host problems, never for what a program does."""

from tidal.errors import UserError


class SandboxError(UserError, RuntimeError):
    """The sandbox cannot work on this host (missing tool, unusable backend); says what to fix."""
