"""A fork server for Python harnesses: one interpreter imports the harness's heavy modules once,
and each episode is a fork of it running the script.

Why: a harness is a fresh process per episode, and a Python one pays its imports every time
(``import openai`` alone: ~1 s of CPU on a 2-core machine, so 32 episodes a step would spend ~16 s
of the step starting interpreters). With ``env.args.preload = ["openai"]`` and a command starting
with ``{python}``, the zygote has imported them already and a fork costs milliseconds. A fork is a
new session (its own process group, stopped as a group like a plain harness), with its own cwd,
environment, argv and stdin, running the script as ``__main__`` exactly as ``python script.py``
would; nothing it does reaches the zygote or the other episodes.

Protocol (lines of JSON): tidal -> zygote ``{"id", "argv", "cwd", "env", "stdin", "log"}``;
zygote -> tidal ``{"id", "pid"}`` once forked and ``{"id", "exit"}`` when the child ends.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import subprocess
import sys
import threading

ZYGOTE = r"""
import json, os, runpy, select, sys, traceback
for name in sys.argv[2:]:
    __import__(name)
exec(compile(sys.argv[1], "<env.args.warmup>", "exec"), {"__name__": "__warmup__"})
jobs, out = {}, sys.stdout

def report(obj):
    out.write(json.dumps(obj) + "\n"); out.flush()

def run(job):
    os.setsid()
    os.chdir(job["cwd"])
    os.environ.clear(); os.environ.update(job["env"])
    fd = os.open(job["stdin"], os.O_RDONLY); os.dup2(fd, 0)
    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1); os.dup2(log, 2)
    sys.stdin = open(0, closefd=False); sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    sys.argv = job["argv"][1:]
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    code = 0
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc(); code = 1
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(code)

buf = b""
while True:
    ready, _, _ = select.select([0], [], [], 0.02)
    if ready:
        chunk = os.read(0, 65536)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            job = json.loads(line)
            pid = os.fork()
            if pid == 0:
                run(job)
            jobs[pid] = job["id"]
            report({"id": job["id"], "pid": pid})
    while jobs:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        report({"id": jobs.pop(pid), "exit": os.waitstatus_to_exitcode(status)})
"""


class ZygoteChild:
    """One forked harness: its pid (== its process group) and its exit code when it ends."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.pid: int | None = None
        self.started = threading.Event()
        self.exited: asyncio.Future = loop.create_future()


class Zygote:
    """A running fork server (see the module docstring); thread-safe, any event loop."""

    def __init__(self, preload: tuple[str, ...], warmup: str = ""):
        self.proc = subprocess.Popen([sys.executable, "-c", ZYGOTE, warmup, *preload],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self._children: dict[int, ZygoteChild] = {}
        self._next = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True, name="tidal-zygote").start()

    def spawn(self, argv: list[str], cwd: str, env: dict, stdin: str, log: str) -> ZygoteChild:
        child = ZygoteChild(asyncio.get_running_loop())
        with self._lock:
            self._next += 1
            job_id = self._next
            self._children[job_id] = child
            line = json.dumps({"id": job_id, "argv": argv, "cwd": cwd, "env": env,
                               "stdin": stdin, "log": log})
            self.proc.stdin.write(line.encode() + b"\n")
        return child

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.alive():
            self.proc.stdin.close()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def _read(self) -> None:
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self._lock:
                child = self._children.get(msg["id"])
                if "exit" in msg:
                    self._children.pop(msg["id"], None)
            if child is None:
                continue
            if "pid" in msg:
                child.pid = msg["pid"]
                child.started.set()
            else:
                _post(child, msg["exit"])
        with self._lock:  # the zygote died: every child it had counts as crashed
            orphans, self._children = list(self._children.values()), {}
        for child in orphans:
            child.started.set()
            _post(child, -1)


def _post(child: ZygoteChild, code: int) -> None:
    """Resolve ``child.exited`` on its event loop (gone if its rollout call already ended)."""
    try:
        child.loop.call_soon_threadsafe(_resolve, child.exited, code)
    except RuntimeError:  # the loop is closed: nobody waits for this exit any more
        pass


def _resolve(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)


_ZYGOTES: dict[tuple, Zygote] = {}


def zygote(preload: tuple[str, ...], warmup: str = "") -> Zygote:
    """The process's fork server for these modules and warm-up (started once, kept for the
    run)."""
    key = (preload, warmup)
    z = _ZYGOTES.get(key)
    if z is None or not z.alive():
        z = _ZYGOTES[key] = Zygote(preload, warmup)
    return z


@atexit.register
def _close_all() -> None:
    for z in _ZYGOTES.values():
        z.close()
