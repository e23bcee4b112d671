"""Python environments for task images: a venv with a task's packages, built once, read-only.

Why: real repositories' tests need pytest and packages, and the sandbox's interpreter has only
the standard library. A task image can carry a `PythonEnv` (image.py); every run of a rollout
over it sees the env mounted read-only at its own host path (bwrap) or reads it in place (the
subprocess backend), with its site-packages importable.

The env is a venv (`python -m venv --without-pip --symlinks`: its interpreter is a link to the
base interpreter, whose prefix the sandbox already mounts) into which the *host's* pip installs
the packages (`pip --python <venv python> install ...`). It is built once per key: a hash of the
interpreter's real path and version, the sorted packages and the pip arguments. It is built in
a temp dir beside its final place, a completion marker written last, then renamed into place
(under a lock file, so two processes building at once do one build and never see half of one);
console-script shebangs that name the temp dir are rewritten to the final path. Everything is
made world-readable (dirs 0755, files 0644 / 0755) so a run's fresh uid can read it: the bwrap
backend reaches it wherever it lives (its parents are recreated traversable), the subprocess
backend's fresh uid needs every parent directory of the cache to be traversable (so not under
a 0700 /root).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from tidal.sandbox.errors import SandboxError

DEFAULT_CACHE = "~/.cache/tidal/python-envs"
MARKER = ".tidal-env-complete"
"""Written last into a complete env (JSON: the packages, the interpreter, pip's arguments)."""
PIP_TIMEOUT_S = 600
STDERR_TAIL = 2000


@dataclass(frozen=True)
class PythonEnv:
    """A built env; all paths are host paths (also its paths inside a bwrap sandbox)."""

    path: str
    """The env's root directory."""
    python: str
    """Its interpreter (bin/python, a link to the base interpreter)."""
    site_packages: str
    """Where its packages are (what a run appends to sys.path)."""
    packages: tuple[str, ...]
    """The requirement strings it was built from, sorted."""


def build_python_env(packages: list[str], python: str, cache_dir: str = "",
                     pip_args: list[str] = ()) -> PythonEnv:
    """The env holding `packages` for interpreter `python`, built now or reused from the cache.

    Raises SandboxError (naming the packages and the end of pip's stderr) when it cannot be
    built; nothing half-built is then left where a later call would take it as complete."""
    if isinstance(packages, str) or not all(isinstance(p, str) and p.strip() for p in packages):
        raise SandboxError(f"packages must be a list of requirement strings, got {packages!r}")
    real = os.path.realpath(python)
    if not os.path.isabs(python) or not os.access(real, os.X_OK):
        raise SandboxError(f"python {python!r} is not an absolute path to an executable")
    wanted = tuple(sorted(p.strip() for p in packages))
    version = _version(real)
    key = hashlib.sha256(json.dumps([real, version, wanted, list(pip_args)]).encode())
    cache = os.path.abspath(os.path.expanduser(cache_dir or DEFAULT_CACHE))
    final = os.path.join(cache, f"py{version.split()[0]}-{key.hexdigest()[:20]}")
    env = _env_at(final, version.split()[0], wanted)
    if os.path.exists(os.path.join(final, MARKER)):
        return env
    os.makedirs(cache, exist_ok=True)
    os.chmod(cache, 0o755)
    with open(final + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same env
        if os.path.exists(os.path.join(final, MARKER)):
            return env
        if os.path.lexists(final):  # not built here (the marker goes in before the rename):
            shutil.rmtree(final)  # rebuild rather than trust it
        _build(final, real, wanted, list(pip_args))
    return env


def _env_at(root: str, version: str, packages: tuple[str, ...]) -> PythonEnv:
    return PythonEnv(root, os.path.join(root, "bin", "python"),
                     os.path.join(root, "lib", f"python{version}", "site-packages"), packages)


def _version(python: str) -> str:
    out = subprocess.run([python, "-E", "-S", "-c",
                          "import sys; print('%d.%d' % sys.version_info[:2], sys.version)"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise SandboxError(f"python {python!r} does not run: {out.stderr.strip()[-400:]}")
    return out.stdout.strip()


def _build(final: str, python: str, packages: tuple[str, ...], pip_args: list[str]) -> None:
    temp = tempfile.mkdtemp(prefix=".building-", dir=os.path.dirname(final))
    try:
        _run([python, "-m", "venv", "--without-pip", "--symlinks", temp], packages, "venv")
        if packages:
            _run([*_installer(), "--python", os.path.join(temp, "bin", "python"), "install",
                  "--no-input", *pip_args, *packages], packages, "pip")
        _fix_shebangs(os.path.join(temp, "bin"), temp, final)
        _open_up(temp)
        with open(os.path.join(temp, MARKER), "w") as f:
            json.dump({"packages": list(packages), "python": python, "pip_args": pip_args}, f)
        os.chmod(os.path.join(temp, MARKER), 0o644)
        os.rename(temp, final)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise


def _installer() -> list[str]:
    """The host's pip (uv's pip interface where uv is installed and pip is not)."""
    uv = shutil.which("uv")
    if uv and subprocess.run([sys.executable, "-m", "pip", "--version"],
                             capture_output=True).returncode != 0:
        return [uv, "pip"]
    return [sys.executable, "-m", "pip", "--disable-pip-version-check"]


def _run(cmd: list[str], packages: tuple[str, ...], what: str) -> None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SandboxError(f"building a python env with {list(packages)}: {what} took more than "
                           f"{PIP_TIMEOUT_S} s (no network?)") from None
    if out.returncode != 0:
        raise SandboxError(f"cannot build a python env with {list(packages)}: {what} exited "
                           f"{out.returncode}: {out.stderr.strip()[-STDERR_TAIL:]}")


def _fix_shebangs(bin_dir: str, temp: str, final: str) -> None:
    """Console scripts name the interpreter by the temp path; point them at the final one."""
    old = f"#!{temp}/".encode()
    for entry in os.scandir(bin_dir):
        if not entry.is_file(follow_symlinks=False):
            continue
        with open(entry.path, "rb") as f:
            data = f.read()
        if data.startswith(old):
            with open(entry.path, "wb") as f:
                f.write(f"#!{final}/".encode() + data[len(old):])


def _open_up(root: str) -> None:
    """Dirs 0755, files 0644 or 0755: readable by a run's fresh uid, writable by no one else."""
    os.chmod(root, 0o755)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISDIR(mode):
                os.chmod(path, 0o755)
            elif stat.S_ISREG(mode):
                os.chmod(path, 0o755 if mode & stat.S_IXUSR else 0o644)
