"""The subprocess backend: the program runs directly on the host, confined only by rlimits and,
when tidal is root, by a uid of its own. No namespaces: it shares the host's files, network and
process table (see the threat model in sandbox.py for exactly what that leaves open).

With a uid of its own the program cannot read root-only files, write root-owned directories or
signal host processes, its fork limit is its own, and `stop()` can find everything it started
even after `setsid` + double fork: every live process with that uid is killed until none is left.
Without one (tidal not root, or the interpreter not reachable by an unprivileged uid) only the
process group is killed and a daemon that left the group survives the run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

from tidal.sandbox.config import SandboxConfig
from tidal.sandbox.limits import Tools, confine_argv, program_env


class PlainRunner:
    name = "subprocess"

    def __init__(self, cfg: SandboxConfig, python: str, tools: Tools, drop_privileges: bool):
        self.cfg, self.python, self.tools = cfg, python, tools
        self.drops_privileges = drop_privileges
        self.guarantees = frozenset({"env", "limits"} | (
            {"user", "processes", "cleanup"} if drop_privileges else set()))

    def launch(self, argv: list[str], workspace: str, uid: int | None, stdin, place=None,
               trace_fd: int | None = None) -> "PlainRun":
        """place: a warm.Place or None (its env is read in place: nothing to mount)."""
        if place is not None and place.overlay is not None:  # rollouts here copy their image
            raise ValueError("the subprocess backend cannot mount an overlay")
        # Without a uid of its own, RLIMIT_NPROC would count all of tidal's user's processes.
        nproc = self.cfg.max_processes if uid is not None else None
        cmd = [*confine_argv(self.tools, self.cfg, uid, nproc), *argv]
        proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=program_env(self.python, workspace), cwd=workspace,
                                start_new_session=True,
                                pass_fds=() if trace_fd is None else (trace_fd,))
        return PlainRun(proc, uid)


class PlainRun:
    def __init__(self, proc: subprocess.Popen, uid: int | None):
        self.proc = proc
        self.uid = uid

    def stop(self) -> None:
        """Kill the program's process group, then every process still running as its uid."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.uid is not None:
            kill_uid(self.uid)


def kill_uid(uid: int) -> None:
    """SIGKILL every live process whose real uid is `uid`, until a scan finds none.

    Only the run's own processes have this uid (it is fresh per run), and they cannot change
    it, so this also catches daemons that left the process group.
    """
    while victims := live_pids_of(uid):
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # exited since the scan
                pass
        time.sleep(0.001)  # let the kills land before the next scan


def live_pids_of(uid: int) -> list[int]:
    """Pids of processes (zombies excluded) whose real uid is `uid`, from /proc/*/status."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                status = f.read()
        except (FileNotFoundError, ProcessLookupError):  # exited since listdir
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        alive = not fields["State"].strip().startswith(("Z", "X"))  # zombie or dead
        if alive and int(fields["Uid"].split()[0]) == uid:
            pids.append(int(name))
    return pids
