"""Why a run ended badly, from what the watch did, the exit status and the program's stderr.

Precedence, first match wins:
  output     the watch stopped reading at the cap and killed the program
  processes  a fork or thread start failed at the process limit (EAGAIN in the traceback)
  memory     an allocation failed at the address-space limit (MemoryError, ENOMEM)
  file_size  a write failed at the file-size limit (EFBIG; Python ignores SIGXFSZ) or SIGXFSZ
  timeout    the watch killed the program at the wall-clock limit
  cpu        SIGXCPU, or SIGKILL once its CPU time reached the limit (the hard rlimit)
  signal     any other death by signal (e.g. SIGSEGV from a stack overflow)
  None       exited by itself: 0, or a non-zero exit code from an uncaught exception
Limit evidence in stderr outranks the timeout because it names the cause: a fork bomb throttled
at the process limit usually lives on until the wall clock kills it. It counts only when the
run did not end cleanly (a program may catch MemoryError, print it and exit 0).

Exit statuses above 128 are read as signals. On bwrap a program that itself exits with 128 + N
looks the same as one killed by signal N; this only mislabels a run that failed anyway.
"""

from __future__ import annotations

import re
import signal

PROCESSES = re.compile(r"^(BlockingIOError: \[Errno 11\]|RuntimeError: can't start new thread)",
                       re.MULTILINE)
MEMORY = re.compile(r"^MemoryError\b|\[Errno 12\] Cannot allocate memory"
                    r"|Fatal Python error: .*memory", re.MULTILINE)
FILE_SIZE = re.compile(r"\[Errno 27\] File too large")


def killed_reason(stopped: str | None, status: int, stderr: str, cpu_s: float,
                  cpu_limit_s: int) -> str | None:
    if stopped == "output":
        return "output"
    if stopped is None and status == 0:
        return None
    if PROCESSES.search(stderr):
        return "processes"
    if MEMORY.search(stderr):
        return "memory"
    if FILE_SIZE.search(stderr) or status == 128 + signal.SIGXFSZ:
        return "file_size"
    if stopped == "timeout":
        return "timeout"
    if status == 128 + signal.SIGXCPU or (status == 128 + signal.SIGKILL and cpu_s >= cpu_limit_s):
        return "cpu"
    if status > 128:
        return "signal"
    return None
