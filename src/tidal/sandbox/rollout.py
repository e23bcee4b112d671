"""A rollout's workspace: copy-on-write over a read-only task image, kept across its runs.

A multi-turn rollout runs many programs (write a file, run the tests, read a file) in one
workspace that starts as the task's image. Many rollouts of one task run at once, so the image
is shared and never written:

  overlay  bwrap mounts an overlayfs at /workspace: the image is the lower layer, the rollout's
           own host dir the upper one. Starting a rollout copies nothing; a run that changes a
           file copies just that file up. Only the mount sees the layers merged.
  copy     the rollout starts from a full copy of the image (any backend; costs a copy of the
           image per rollout; tidal.bench.sandbox_bench measures both).

Each run is still its own sandbox (fresh namespaces, and when tidal is root a fresh uid that is
given the rollout's files for the run), so nothing but the workspace's files carries from one
run to the next. The files a run is given are written from inside its sandbox (warm.BOOT), so
an overlay's upper layer is only ever changed through the mount. With a warm pool the next
run's sandbox is started as soon as the previous one ends, while the model generates.

An image's Python env and protected files reach every run (warm.Place); `files()` reads the
workspace as the rollout left it (files.py) and `trace` gathers every run's trace events.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import dataclasses
import threading
from concurrent.futures import Future

from tidal.evidence.records import TraceEvent

from tidal.sandbox.bwrap import Overlay
from tidal.sandbox.files import read_tree
from tidal.sandbox.image import TaskImage
from tidal.sandbox.result import RunResult
from tidal.sandbox.warm import Job, Place, Starter, WarmPool, discard_when_started
from tidal.sandbox.workspace import remove_tree

ROLLOUT_PREFIX = "tidal-rollout-"
PROBE_TEXT = "overlay-probe"
PYTEST_MAIN = "pytest"
"""The name run_pytest's in-process runner has (its __file__ and traceback name)."""
PYTEST_DEFAULT_ARGS = ("-p", "no:cacheprovider")
"""run_pytest writes no .pytest_cache into the workspace (it would show in files())."""
FILES_MAX_BYTES = 8 << 20


class Rollout:
    """Runs programs one at a time in this rollout's workspace; see the module docstring."""

    def __init__(self, starter: Starter, pool: WarmPool | None, image: TaskImage, mode: str):
        self.mode = mode
        """"overlay" or "copy"."""
        self._starter, self._pool = starter, pool
        self._dir = tempfile.mkdtemp(prefix=ROLLOUT_PREFIX)
        os.chmod(self._dir, 0o711)  # a run's uid reaches its workspace below, lists nothing
        self.image = image
        self._place = _make_place(self._dir, image, mode)
        self.trace: list[TraceEvent] = []
        """Every traced run's events in order, each with `run` set to the run's index (0 = the
        rollout's first run, traced or not)."""
        self.runs = 0
        """How many runs this rollout has had."""
        self._lock = threading.Lock()
        self._closed = False
        self._next: Future | None = pool.prestart(self._place) if pool else None

    def run(self, argv: list[str], files: dict[str, str] | None = None,
            stdin: str | None = None) -> RunResult:
        """Run argv in this rollout's workspace, after writing `files` into it. Never raises
        for anything the program does."""
        return self._run(Job(argv=list(argv), files=dict(files or {}), stdin=stdin))

    def run_python(self, code: str, stdin: str | None = None,
                   files: dict[str, str] | None = None, main: str = "main.py") -> RunResult:
        """Run `code`, saved as `main` in the workspace, as the sandbox's __main__: the stdlib,
        the workspace and the image's Python env (if it has one) are importable."""
        return self._run(Job(code=code, main=main, files={**(files or {}), main: code},
                             stdin=stdin))

    def run_pytest(self, args: list[str], files: dict[str, str] | None = None,
                   stdin: str | None = None) -> RunResult:
        """pytest.main(["-p", "no:cacheprovider", *args]) in the sandbox's own interpreter
        (traced, and no second interpreter start), writing no bytecode or cache into the
        workspace; the exit code is pytest's. Needs an image whose Python env has pytest."""
        if isinstance(args, str) or not all(isinstance(a, str) for a in args):
            raise ValueError(f"args must be a list of strings, got {args!r}")
        if self.image.python_env is None:
            raise ValueError("run_pytest needs a task image with a python_env holding pytest")
        code = ("import sys\nsys.dont_write_bytecode = True\nimport pytest\n"
                f"sys.exit(int(pytest.main({[*PYTEST_DEFAULT_ARGS, *args]!r})))\n")
        return self._run(Job(code=code, main=PYTEST_MAIN, files=dict(files or {}),
                             stdin=stdin))

    def files(self, max_bytes: int = FILES_MAX_BYTES) -> dict[str, str]:
        """The workspace as the rollout left it (relative path -> text), read host-side;
        see files.py for symlinks, whiteouts and the max_bytes marker."""
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        with self._lock:
            if self._closed:
                raise ValueError("this rollout's workspace is closed")
            lower = self._place.overlay.image if self._place.overlay is not None else None
            return read_tree(self._place.workspace, lower, max_bytes)

    def _run(self, job: Job) -> RunResult:
        with self._lock:
            if self._closed:
                raise ValueError("this rollout's workspace is closed")
            slot = self._next.result() if self._next is not None else None
            self._next = None
            index = self.runs
            self.runs += 1
            try:
                result = self._starter.run(job, self._place, slot)
                if result.trace is not None:
                    result.trace = [dataclasses.replace(e, run=index) for e in result.trace]
                    self.trace.extend(result.trace)
                return result
            finally:
                if self._pool is not None:
                    self._next = self._pool.prestart(self._place)

    def close(self) -> None:
        """Discard the waiting sandbox and delete the rollout's layer. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._next is not None:
                discard_when_started(self._next)
                self._next = None
            remove_tree(self._dir)

    def __enter__(self) -> "Rollout":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _make_place(root: str, image: TaskImage, mode: str) -> Place:
    if mode == "overlay":
        upper, work = os.path.join(root, "upper"), os.path.join(root, "work")
        os.mkdir(upper)
        os.mkdir(work)
        return Place(upper, Overlay(image.path, work), image.python_env, image.protected)
    workspace = os.path.join(root, "workspace")
    shutil.copytree(image.path, workspace, symlinks=True)
    return Place(workspace, None, image.python_env, image.protected)


def probe_overlay(starter: Starter) -> str | None:
    """None if an overlay workspace works here (read the image, write over it, image intact),
    else what went wrong."""
    with TaskImage.from_files({"probe.txt": PROBE_TEXT}) as image:
        root = tempfile.mkdtemp(prefix=ROLLOUT_PREFIX)
        try:
            place = _make_place(root, image, "overlay")
            code = "print(open('probe.txt').read()); open('probe.txt', 'w').write('changed')"
            result = starter.run(Job(code=code), place)
        finally:
            remove_tree(root)
        with open(os.path.join(image.path, "probe.txt")) as f:
            image_intact = f.read() == PROBE_TEXT
    if result.exit_code == 0 and result.stdout == PROBE_TEXT + "\n" and image_intact:
        return None
    return (f"a probe run gave exit code {result.exit_code}, killed_reason "
            f"{result.killed_reason}, stdout {result.stdout.strip()[-200:]!r}, stderr "
            f"{result.stderr.strip()[-400:]!r}, image intact: {image_intact}")
