"""Watch one launched program: read its output with a cap, enforce the wall clock, reap it.

One thread, one selector over stdout, stderr and a pidfd of the launched process. The pidfd
matters: a program may hand its stdout to a daemon and exit, so "both pipes at EOF" is not
"the program ended". A traced run adds its trace pipe (trace.py), read with its own cap: past
the cap it is still read, and dropped, so that a flood never stops the run. The trace pipe is
not watched line by line (a wake-up of this thread per event cost ~15 us of the program's time
on a busy 2-core host) but emptied every TRACE_POLL_S; its buffer (warm.TRACE_PIPE_BYTES) holds
far more than a program writes in that time, so the program does not wait on it. Whatever way the watch ends (exit, timeout, output cap), the backend's
`stop()` runs and must return only once nothing the program started is still alive.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from dataclasses import dataclass
from typing import Protocol

READ_CHUNK = 1 << 16
TRACE_POLL_S = 0.01


class Launched(Protocol):
    proc: subprocess.Popen
    """Started with stdout=PIPE, stderr=PIPE and start_new_session=True."""

    def stop(self) -> None:
        """Kill everything the run started; return once all of it is gone."""


@dataclass
class Outcome:
    status: int
    """Exit status of the launched process; death by signal N reads 128 + N (shell convention)."""
    stopped: str | None
    """"timeout" or "output" when the watch killed the program, else None."""
    stdout: bytes
    stderr: bytes
    cpu_s: float
    """User + system CPU of the launched process and every descendant it (or bwrap) reaped."""
    trace: bytes = b""
    """What the program wrote to its trace pipe, at most the trace cap."""


def supervise(run: Launched, deadline: float, max_output_bytes: int,
              trace_fd: int | None = None, max_trace_bytes: int = 0) -> Outcome:
    """Watch `run` until it exits, the deadline (time.monotonic) passes or a stream overflows;
    `trace_fd` (the trace pipe's read end, left open) is read alongside."""
    proc = run.proc
    pidfd = os.pidfd_open(proc.pid)
    streams = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    trace = bytearray()
    with selectors.DefaultSelector() as selector:
        for fd in streams:
            selector.register(fd, selectors.EVENT_READ)
        selector.register(pidfd, selectors.EVENT_READ)
        poll = TRACE_POLL_S if trace_fd is not None else None
        stopped, exited = None, False
        while not exited and stopped is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                stopped = "timeout"
                break
            ready = selector.select(remaining if poll is None else min(remaining, poll))
            if trace_fd is not None:
                _empty_trace(trace_fd, trace, max_trace_bytes)
            for key, _ in ready:
                if key.fd == pidfd:
                    exited = True
                elif not _read_some(key.fd, streams[key.fd], selector, max_output_bytes):
                    stopped = "output"
        run.stop()
        _, waitstatus, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(waitstatus)  # keeps Popen from waiting again
        selector.unregister(pidfd)
        if trace_fd is not None:  # every writer is gone (see _drain): this reaches EOF
            selector.register(trace_fd, selectors.EVENT_READ)
        if stopped != "output":  # a timed-out program's last words are worth keeping
            _drain(selector, streams, max_output_bytes, trace_fd, trace, max_trace_bytes)
    os.close(pidfd)
    proc.stdout.close()
    proc.stderr.close()
    out, err = streams.values()
    return Outcome(exit_status(waitstatus), stopped, bytes(out), bytes(err),
                   usage.ru_utime + usage.ru_stime, bytes(trace))


def exit_status(waitstatus: int) -> int:
    """128 + N for death by signal N, else the exit code: one convention for both backends
    (bwrap can only report a signal death this way)."""
    if os.WIFSIGNALED(waitstatus):
        return 128 + os.WTERMSIG(waitstatus)
    return os.WEXITSTATUS(waitstatus)


def _read_some(fd: int, buf: bytearray, selector: selectors.BaseSelector, cap: int) -> bool:
    """Append what is ready on fd; False once buf went over the cap (buf is cut to the cap)."""
    data = os.read(fd, READ_CHUNK)
    if not data:
        selector.unregister(fd)
        return True
    buf += data
    if len(buf) > cap:
        del buf[cap:]
        return False
    return True


def _empty_trace(fd: int, buf: bytearray, cap: int) -> None:
    """Read what the trace pipe holds now (its read end is non-blocking), up to the cap."""
    while True:
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return
        if not data:
            return
        if len(buf) < cap:
            buf += data[:cap - len(buf)]


def _read_trace(fd: int, buf: bytearray, selector: selectors.BaseSelector, cap: int) -> None:
    """Append what is ready on the trace pipe up to the cap; drop the rest (keep reading)."""
    try:
        data = os.read(fd, READ_CHUNK)
    except BlockingIOError:
        return
    if not data:
        selector.unregister(fd)
    elif len(buf) < cap:
        buf += data[:cap - len(buf)]


def _drain(selector: selectors.BaseSelector, streams: dict[int, bytearray], cap: int,
           trace_fd: int | None = None, trace: bytearray | None = None,
           trace_cap: int = 0) -> None:
    """Read what the finished program left in its pipes, without waiting for more.

    Every writer is dead by now on both isolating backends, so the pipes reach EOF; a daemon
    that escaped (the subprocess backend without a uid of its own) cannot make this block.
    """
    while selector.get_map():
        ready = selector.select(0)
        if not ready:
            return
        for key, _ in ready:
            if key.fd == trace_fd:
                _read_trace(trace_fd, trace, selector, trace_cap)
            elif not _read_some(key.fd, streams[key.fd], selector, cap):
                selector.unregister(key.fd)
