"""A task image: the read-only starting files of a task, shared by all of its rollouts.

tidal builds the image once per task, as its own private copy (so later changes to the source
do not reach rollouts already running) inside a 0700 directory that no sandboxed uid can
traverse. Each rollout then sees it through a copy-on-write workspace (rollout.py): its writes
go to its own layer and never reach the image or another rollout.

Inside the copy every directory is made 0777 and every file 0666 (0777 if executable): when
tidal is root, each run is a fresh uid that must be able to change any file of the task as seen
through the overlay; overlayfs checks the caller against the image file's own mode and then
copies the file up into the rollout's layer, so the image itself is never written. The private
parent keeps those modes from meaning anything on the host.

An image may carry a Python env (pyenv.py: mounted read-only into every run of its rollouts)
and name `protected` files (visible tests, verifier files): those are read-only inside every
rollout (bwrap.place_mounts, workspace.py), and `changed_protected` compares what a rollout
left against the sha256 taken here.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile

from tidal.sandbox.pyenv import PythonEnv
from tidal.sandbox.workspace import check_file_name, remove_tree, write_file

IMAGE_PREFIX = "tidal-image-"
SEALED_NAMES = (".git", ".hg", ".svn", ".bzr", "__pycache__", "*.pyc", ".pytest_cache",
                ".mypy_cache", ".ruff_cache", ".pyre", ".pytype", ".hypothesis", ".tox", ".nox")
"""What TaskImage.from_dir leaves out of a task (any depth) unless told to keep history: the
repository's history and the caches of earlier runs, where the known fix can be read."""


class TaskImage:
    """A private, read-only-by-convention directory tree; `path` is what rollouts layer over."""

    def __init__(self, path: str, owner_dir: str, python_env: PythonEnv | None = None,
                 protected: tuple[str, ...] = ()):
        self.path = path
        """Host path of the image's root directory."""
        self._owner_dir = owner_dir
        self.python_env = python_env
        """The Python env every run of its rollouts sees (None: the stdlib only)."""
        self.protected = protected
        """Relative paths of files rollouts cannot change (sorted)."""
        self.protected_sha256: dict[str, str] = {}
        """Path -> sha256 of the protected file's text as Rollout.files() reads it."""

    @classmethod
    def from_files(cls, files: dict[str, str], python_env: PythonEnv | None = None,
                   protected: tuple[str, ...] | list[str] = ()) -> "TaskImage":
        """An image holding `files` (relative path -> text)."""
        for name in files:
            check_file_name(name)
        image = cls._empty(python_env)
        for name, text in files.items():
            write_file(image.path, name, text)
        return image._finish(protected)

    @classmethod
    def from_dir(cls, source: str, python_env: PythonEnv | None = None,
                 protected: tuple[str, ...] | list[str] = (),
                 keep_history: bool = False) -> "TaskImage":
        """An image holding a copy of the directory `source` (symlinks copied as links).

        History is sealed: unless ``keep_history``, version-control metadata and the caches of
        earlier runs (SEALED_NAMES: ``.git``, ``__pycache__``, ``.mypy_cache``, ...) are left
        out, so an agent cannot mine the commit that fixed the task or a type checker's
        leftovers for the answer."""
        if not os.path.isdir(source):
            raise ValueError(f"task image source {source!r} is not an existing directory")
        image = cls._empty(python_env)
        os.rmdir(image.path)
        ignore = None if keep_history else shutil.ignore_patterns(*SEALED_NAMES)
        shutil.copytree(source, image.path, symlinks=True, ignore=ignore)
        return image._finish(protected)

    @classmethod
    def _empty(cls, python_env: PythonEnv | None) -> "TaskImage":
        if python_env is not None and not isinstance(python_env, PythonEnv):
            raise ValueError(f"python_env must be a PythonEnv (build_python_env), got "
                             f"{python_env!r}")
        owner_dir = tempfile.mkdtemp(prefix=IMAGE_PREFIX)  # 0700: the image's modes stay private
        path = os.path.join(owner_dir, "image")
        os.mkdir(path)
        return cls(path, owner_dir, python_env)

    def _finish(self, protected) -> "TaskImage":
        try:
            if isinstance(protected, str):
                raise ValueError(f"protected must be a list of paths, got {protected!r}")
            for name in protected:
                check_file_name(name)
                path = os.path.join(self.path, name)
                if os.path.islink(path) or not os.path.isfile(path) or _through_link(
                        self.path, name):
                    raise ValueError(f"protected path {name!r} is not a regular file of the "
                                     "task image")
                with open(path, "rb") as f:
                    self.protected_sha256[name] = text_sha256(f.read().decode("utf-8",
                                                                              "replace"))
            self.protected = tuple(sorted(set(protected)))
            _open_up_modes(self.path)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Delete the image (rollouts over it must be closed first)."""
        if os.path.exists(self._owner_dir):
            remove_tree(self._owner_dir)

    def __enter__(self) -> "TaskImage":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _through_link(root: str, name: str) -> bool:
    """Whether a directory on the way to root/name is a symlink."""
    parts = name.split("/")[:-1]
    return any(os.path.islink(os.path.join(root, *parts[:i + 1])) for i in range(len(parts)))


def _open_up_modes(root: str) -> None:
    """Directories 0777, files 0666 or 0777 (executable); links untouched (see module doc)."""
    os.chmod(root, 0o777)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            info = os.lstat(path)
            if stat.S_ISDIR(info.st_mode):
                os.chmod(path, 0o777)
            elif stat.S_ISREG(info.st_mode):
                os.chmod(path, 0o777 if info.st_mode & stat.S_IXUSR else 0o666)
