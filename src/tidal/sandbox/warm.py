"""Warm sandboxes: confined interpreters started ahead of time, each waiting for one program.

Why: a cold run pays bwrap's namespace setup and an interpreter start (~15 ms here) after the
model has produced its code. A warm sandbox has paid both earlier, on a launcher thread, while
the model was still generating; the program then only travels down a pipe. Every warm sandbox
runs exactly one program and is then torn down exactly like a cold run (namespace killed,
workspace removed), so nothing a program leaves behind (files, processes, imported modules, a
patched builtin) can reach another program: a used sandbox is never reused.

The sandbox runs `python -E -s -S -c BOOT` under the same namespaces, rlimits, uid and
environment as a cold run, with stdin a pipe from tidal. BOOT reads one job (marshal: files,
stdin, and either argv to exec or Python code to run) until tidal closes the pipe, writes the
files into its own workspace (from inside, so a rollout's overlay is only ever changed through
the mount), makes fd 0 the job's stdin, and then either execs argv or runs the code as
`__main__` in this same interpreter (argv, __file__ and sys.path[0] set as `python main.py`
would set them). Reading EOF with no job means tidal discarded it unused.

Warm sandboxes are launched on the pool's own long-lived thread: bwrap's --die-with-parent and
setpriv's --pdeathsig fire when the *thread* that started them ends, so a sandbox launched from
a short-lived worker thread would die while waiting.
"""

from __future__ import annotations

import fcntl
import logging
import marshal
import os
import select
import subprocess
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field

from tidal.sandbox.bwrap import WORKSPACE, Overlay
from tidal.sandbox.config import SandboxConfig
from tidal.sandbox.limits import new_sandbox_uid, program_env
from tidal.sandbox.pyenv import PythonEnv
from tidal.sandbox.result import RunResult, watch
from tidal.sandbox.supervise import Launched
from tidal.sandbox.trace import HOOK
from tidal.sandbox.workspace import Workspace, check_file_name

log = logging.getLogger(__name__)

TRACE_PIPE_BYTES = 256 << 10
"""Buffer of each run's trace pipe (~4000 events): more than a program writes between two
empties of the pipe by the supervisor."""
WARM_MARKER = "tidal-warm-sandbox"
"""In every warm sandbox's command line (BOOT's first line), so tests can find leftovers."""

BOOT_BODY = r"""
import marshal, os, sys
_trace_fd = int(sys.argv[1]) if len(sys.argv) > 2 else -1
_tidal_trace = None
if _trace_fd >= 0:
    os.set_inheritable(_trace_fd, False)  # not for the programs it runs
    exec(marshal.loads(bytes.fromhex(sys.argv[2])))  # defines _tidal_trace (trace.HOOK)
def _read_job():
    chunks = []
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    if not chunks:
        os._exit(0)
    return marshal.loads(b"".join(chunks))
def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        import shutil
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
def _write(name, data):
    parts = name.split("/")
    for i in range(1, len(parts)):
        parent = "/".join(parts[:i])
        if os.path.islink(parent) or not os.path.isdir(parent):
            _remove(parent)
            os.mkdir(parent)
    _remove(name)
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.close(fd)
def _set_stdin(data):
    if data is None:
        fd = os.open("/dev/null", os.O_RDONLY)
    else:
        fd = os.memfd_create("stdin")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, 0)
    os.dup2(fd, 0)
    os.close(fd)
def _find(name):
    if "/" in name:
        return name
    for d in os.environ.get("PATH", "").split(":"):
        if d and os.access(d + "/" + name, os.X_OK) and not os.path.isdir(d + "/" + name):
            return d + "/" + name
    return None
_job = _read_job()
for _name, _data in _job["files"]:
    try:
        _write(_name, _data)
    except OSError as _e:  # e.g. a protected file: the program runs and finds it unchanged
        os.write(2, ("tidal-sandbox: cannot write %s: %s\n" % (_name, _e.strerror)).encode())
_name = _data = None
_set_stdin(_job["stdin"])
os.environ.update(_job["environ"])
sys.path.extend(_job["sys_path"])
try:
    _root = os.getcwd()
except OSError:  # the workspace dir was removed under a waiting sandbox
    _root = "/workspace"
if _trace_fd >= 0:
    _tidal_trace(_trace_fd, _root, frozenset(_job["watch"]),
                 tuple({sys.prefix + "/", sys.base_prefix + "/", *_job["quiet"]}))
del _tidal_trace
if _job["argv"] is not None:
    _path = _find(_job["argv"][0])
    try:
        if _path is None:
            raise FileNotFoundError(2, "No such file or directory")
        os.execv(_path, _job["argv"])
    except OSError as _e:
        os.write(2, ("tidal-sandbox: cannot run %s: %s\n" % (_job["argv"][0], _e.strerror)).encode())
        os._exit(127)
sys.argv = [_job["main"]]
sys.path[0] = os.path.dirname(os.path.abspath(_job["main"]))
_main = type(sys)("__main__")
_main.__file__ = os.path.abspath(_job["main"])
_main.__builtins__ = __builtins__
sys.modules["__main__"] = _main
_code = compile(_job["code"], _job["main"], "exec")
del _job, _name, _data, _read_job, _remove, _write, _set_stdin, _find, _trace_fd, _root
exec(_code, _main.__dict__)
"""
BOOT = f"# {WARM_MARKER}\n{BOOT_BODY}"
"""Run as `python -E -s -S -c BOOT [TRACE_FD HOOK_CODE]`: with tracing, the trace pipe's fd and
trace.HOOK compiled once per Sandbox by the sandbox's own interpreter (marshal, hex), which
saves each sandbox start compiling it (~1.7 ms of CPU here)."""


@dataclass(frozen=True)
class Job:
    """One program to run: `argv`, or Python `code` run as the file `main` (exactly one)."""

    argv: list[str] | None = None
    code: str | None = None
    main: str = "main.py"
    files: dict[str, str] = field(default_factory=dict)
    stdin: str | None = None

    def __post_init__(self):
        if (self.argv is None) == (self.code is None):
            raise ValueError("a job has either argv or code")
        for name in self.files:
            check_file_name(name)  # before any sandbox is taken for it

    def encode(self, place: "Place", path: str) -> bytes:
        """The job as BOOT reads it, with what `place` adds (its image's env and protected
        files); `path` is the sandbox's default PATH."""
        files = [(name, text.encode()) for name, text in self.files.items()]
        env = place.env
        environ = {} if env is None else {"PATH": f"{os.path.dirname(env.python)}:{path}",
                                          "VIRTUAL_ENV": env.path}
        return marshal.dumps({"argv": self.argv, "code": self.code, "main": self.main,
                              "files": files, "stdin": None if self.stdin is None
                              else self.stdin.encode(), "environ": environ,
                              "sys_path": [] if env is None else [env.site_packages],
                              "quiet": [] if env is None else [env.path + "/"],
                              "watch": [f"{WORKSPACE}/{p}" for p in place.protected]})


@dataclass(frozen=True)
class Place:
    """Where a run's workspace lives: a fresh temp dir (None), or a rollout's dir, which is the
    upper layer over `overlay.image` when overlay is set."""

    workspace: str | None = None
    overlay: Overlay | None = None
    env: PythonEnv | None = None
    """The image's Python env: mounted read-only, its site-packages on sys.path, its bin/ first
    on PATH."""
    protected: tuple[str, ...] = ()
    """Relative paths of the image's protected files (read-only over the workspace)."""


class Slot:
    """One started sandbox waiting for its job; owns its workspace until `run` or `discard`."""

    def __init__(self, launched: Launched, cleanup: ExitStack, trace_fd: int | None = None):
        self.launched = launched
        self._cleanup = cleanup
        self.trace_fd = trace_fd
        """Read end of the run's trace pipe (closed by the cleanup), or None: tracing off."""

    def run(self, job: bytes, cfg: SandboxConfig) -> RunResult | None:
        """Hand the job over and watch it; None if the sandbox had died while waiting (it is
        then discarded)."""
        started = time.monotonic()
        if not self.waiting():
            self.discard()
            return None
        try:
            _write_all(self.launched.proc.stdin, job)
        except BrokenPipeError:
            self.discard()
            return None
        with self._cleanup:
            return watch(self.launched, started, cfg, self.trace_fd)

    def waiting(self) -> bool:
        """Whether the sandbox is still alive (it may have been killed while it waited, say by
        the OOM killer). Checked through a pidfd so that the process is not reaped here."""
        pidfd = os.pidfd_open(self.launched.proc.pid)
        exited = select.poll()  # (not select.select: pidfds may be numbered above 1024)
        exited.register(pidfd, select.POLLIN)  # readable once the process has exited
        try:
            return not exited.poll(0)
        finally:
            os.close(pidfd)

    def discard(self) -> None:
        """Tear the sandbox down unused."""
        with self._cleanup:
            self.launched.proc.stdin.close()  # BOOT reads EOF and exits...
            self.launched.stop()  # ...but kill it and its namespace regardless
            self.launched.proc.wait()
            self.launched.proc.stdout.close()
            self.launched.proc.stderr.close()


def _write_all(pipe, data: bytes) -> None:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(pipe.fileno(), view):]
    finally:
        pipe.close()


class Starter:
    """Starts slots for one backend; holds no reference to the Sandbox (see WarmPool.close)."""

    def __init__(self, runner, cfg: SandboxConfig, python: str):
        self.runner, self.cfg, self.python = runner, cfg, python
        self.path = program_env(python, WORKSPACE)["PATH"]
        self.boot = BOOT
        self._hook: str | None = None
        self._hook_lock = threading.Lock()

    def _hook_code(self) -> str:
        with self._hook_lock:
            if self._hook is None:
                self._hook = compile_for(self.python, HOOK)
            return self._hook

    def start(self, place: Place) -> Slot:
        uid = new_sandbox_uid() if self.runner.drops_privileges else None
        with ExitStack() as cleanup:
            host_dir = cleanup.enter_context(Workspace(place.workspace, {}, uid,
                                                       place.protected))
            argv = [self.python, "-E", "-s", "-S", "-c", self.boot]
            trace_read = trace_write = None
            if self.cfg.trace:
                trace_read, trace_write = trace_pipe(self.cfg.max_trace_bytes)
                cleanup.callback(os.close, trace_read)
                argv += [str(trace_write), self._hook_code()]
            try:
                launched = self.runner.launch(argv, host_dir, uid, subprocess.PIPE, place,
                                              trace_write)
            finally:
                if trace_write is not None:
                    os.close(trace_write)  # the sandbox holds the only write end
            return Slot(launched, cleanup.pop_all(), trace_read)

    def run(self, job: Job, place: Place, slot: Slot | None = None) -> RunResult:
        """Run `job` on `slot` (started for `place`), or on a slot started now if it is None or
        turns out to have died while waiting."""
        data = job.encode(place, self.path)
        if slot is not None:
            result = slot.run(data, self.cfg)
            if result is not None:
                return result
            log.warning("sandbox: a warm sandbox died while waiting; starting a fresh one")
        result = self.start(place).run(data, self.cfg)
        if result is None:
            raise RuntimeError("a freshly started sandbox exited before reading its program")
        return result


def trace_pipe(cap: int) -> tuple[int, int]:
    """(read end, non-blocking; write end) of a run's trace pipe, its buffer enlarged so that
    the supervisor can empty it now and then (supervise.TRACE_POLL_S) without the program
    waiting; where the kernel refuses a bigger buffer, the default 64 KiB."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    try:
        fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, min(cap, TRACE_PIPE_BYTES))
    except OSError:  # over the user's pipe-buffer quota (not root) or pipe-max-size
        pass
    return read, write


def compile_for(python: str, source: str) -> str:
    """`source` compiled by `python` itself (so its bytecode fits), as marshal hex."""
    out = subprocess.run([python, "-E", "-s", "-S", "-c",
                          "import marshal, sys; sys.stdout.write(marshal.dumps(compile("
                          "sys.stdin.read(), '<tidal-trace>', 'exec')).hex())"],
                         input=source, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"{python} cannot compile the trace hook: {out.stderr[-400:]}")
    return out.stdout


class WarmPool:
    """Keeps `size` slots with fresh workspaces started ahead of demand, on a launcher thread
    that lives as long as the pool; also starts rollouts' next slots on that thread."""

    def __init__(self, starter: Starter, size: int):
        self.starter = starter
        self._launcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tidal-sandbox-warm")
        self._lock = threading.Lock()
        self._closed = False
        self._ready: deque[Future] = deque(self.prestart(Place()) for _ in range(size))

    def prestart(self, place: Place) -> Future:
        return self._launcher.submit(self.starter.start, place)

    def take(self) -> Slot | None:
        """A started fresh-workspace slot, replaced in the pool by a new one; None when none is
        ready yet (the caller then starts its own rather than queue behind the launcher)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the sandbox was closed")
            ready = next((f for f in self._ready if f.done()), None)
            if ready is None:
                return None
            self._ready.remove(ready)
            self._ready.append(self.prestart(Place()))
        return ready.result()

    def close(self) -> None:
        """Discard every waiting slot and stop the launcher. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending = list(self._ready)
            self._ready.clear()
        for future in pending:
            discard_when_started(future)
        self._launcher.shutdown(wait=True)


def discard_when_started(future: Future) -> None:
    """Discard the slot a prestart future yields (or drop it if it never started)."""
    if future.cancel():
        return
    if future.exception() is None:
        future.result().discard()
