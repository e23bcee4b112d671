"""Why a run ended badly, from what the watch did, the exit status and the program's stderr.

Precedence, first match wins:
  processes  a fork or thread start failed at the process limit (EAGAIN in the traceback)
  output     the watch stopped reading at the cap and killed the program
  memory     an allocation failed at the address-space limit (MemoryError, ENOMEM)
  file_size  a write failed at the file-size limit (EFBIG; Python ignores SIGXFSZ) or SIGXFSZ
  timeout    the watch killed the program at the wall-clock limit
  cpu        SIGXCPU, or SIGKILL once its CPU time reached the limit (the hard rlimit)
  signal     any other death by signal (e.g. SIGSEGV from a stack overflow)
  None       exited by itself: 0, or a non-zero exit code from an uncaught exception
Limit evidence in stderr outranks the timeout because it names the cause: a fork bomb throttled
at the process limit usually lives on until the wall clock kills it. It counts only when the
run did not end cleanly (a program may catch MemoryError, print it and exit 0). The process
limit's evidence outranks the output cap too: a throttled fork bomb's children each die with a
BlockingIOError traceback, and 16 processes doing so in a loop can fill the 64 KiB cap before the
wall clock ends the run (seen once in a full test suite on an Intel Xeon with AMX).

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
    if stopped is None and status == 0:
        return None
    if PROCESSES.search(stderr):
        return "processes"
    if stopped == "output":
        return "output"
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
