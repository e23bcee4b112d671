"""What one run returns, and how it is read off a supervised program."""

from __future__ import annotations

import time
from dataclasses import dataclass

from tidal.evidence.records import TraceEvent

from tidal.sandbox.config import SandboxConfig
from tidal.sandbox.reasons import killed_reason
from tidal.sandbox.supervise import Launched, supervise
from tidal.sandbox.trace import parse_trace


@dataclass
class RunResult:
    exit_code: int | None
    """Exit code; death by signal N is 128 + N on both backends. None when the sandbox killed
    the program at the wall clock or the output cap (killed_reason "timeout" or "output", or
    "processes" where a fork failed at the process limit first: reasons.py)."""
    stdout: str
    """At most cfg.max_output_bytes of it (UTF-8, undecodable bytes replaced)."""
    stderr: str
    wall_s: float
    """Seconds from launch (or, for a warm sandbox, from handing it the program) until every
    process of the run was gone."""
    killed_reason: str | None
    """None, "timeout", "memory", "cpu", "output", "processes", "signal" or "file_size"; see
    reasons.py for how each is told apart."""
    trace: list[TraceEvent] | None = None
    """What the program did (trace.py), in order; None when the run was not traced (tracing
    off, or a cold Sandbox.run of argv). An argv run's trace holds just its exec."""


def watch(launched: Launched, started: float, cfg: SandboxConfig,
          trace_fd: int | None = None) -> RunResult:
    """Supervise a launched run from `started` (time.monotonic) under cfg's limits, reading
    its trace from `trace_fd` when given."""
    outcome = supervise(launched, started + cfg.timeout_s, cfg.max_output_bytes, trace_fd,
                        cfg.max_trace_bytes)
    wall_s = time.monotonic() - started
    stderr = outcome.stderr.decode("utf-8", "replace")
    return RunResult(
        exit_code=None if outcome.stopped else outcome.status,
        stdout=outcome.stdout.decode("utf-8", "replace"),
        stderr=stderr,
        wall_s=wall_s,
        killed_reason=killed_reason(outcome.stopped, outcome.status, stderr, outcome.cpu_s,
                                    cfg.cpu_s),
        trace=None if trace_fd is None else parse_trace(outcome.trace),
    )
