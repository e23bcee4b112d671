"""Sandbox limits for running untrusted generated code."""

from typing import Literal

from pydantic import Field

from tidal.config.base import Section


class SandboxConfig(Section):
    backend: Literal["auto", "bwrap", "subprocess"] = "auto"
    """auto = bubblewrap where it works, else a plain subprocess with rlimits (with a warning)."""
    timeout_s: float = Field(5.0, gt=0)
    """Wall-clock limit per run, seconds."""
    cpu_s: int = Field(5, ge=1)
    """CPU-time limit (RLIMIT_CPU), seconds."""
    memory_mb: int = Field(512, ge=16)
    """Address-space limit (RLIMIT_AS), MiB."""
    max_processes: int = Field(16, ge=1)
    """Process/thread limit inside the sandbox (RLIMIT_NPROC / pid namespace)."""
    max_output_bytes: int = Field(65536, ge=1024)
    """stdout/stderr captured per stream; more kills the run with reason "output"."""
    max_file_bytes: int = Field(1 << 20, ge=1024)
    """Largest file the program may write (RLIMIT_FSIZE), bytes."""
    concurrency: int = Field(2, ge=1)
    """Sandboxes run in parallel when grading a batch."""
