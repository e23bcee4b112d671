"""The one writable directory a run sees: a fresh temp dir (deleted after) or the caller's own.

A caller's workspace may be reused across runs, so it may hold whatever the last program left,
including symlinks aimed at host files (`main.py -> /root/.bashrc`). tidal writes into it as
the host user (often root), so files are written without following any symlink, and ownership
is handed over and back with lchown (never through a link).

When runs get a uid of their own, everything inside the workspace is given to that uid for the
run and returned to its owner afterwards. The directory itself stays its owner's, shared with
the run's uid through its group (mode 0770): the program can fill and empty it, but cannot
chmod, rename or delete it (not even in a sticky /tmp), so tidal can always clean up after it.

Protected files (a rollout's copy of an image's visible tests) stay owned by tidal, mode 0444,
and so do the directories above them, made sticky (1777, the root 1770): the run's uid can add
files beside them but cannot change, chmod, delete or rename a protected file or any directory
on its way (a sticky directory lets only an entry's owner remove or rename it).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import PurePosixPath

TEMP_PREFIX = "tidal-sbx-"


class Workspace:
    """Context manager yielding the host path of the run's workspace, with `files` written in."""

    def __init__(self, path: str | None, files: dict[str, str], uid: int | None,
                 protected: tuple[str, ...] = ()):
        self.given = path
        self.files = files
        self.uid = uid
        self.protected = protected

    def __enter__(self) -> str:
        for name in self.files:
            check_file_name(name)  # before creating anything that would then need removing
        if self.given is None:
            self.path = tempfile.mkdtemp(prefix=TEMP_PREFIX)
        else:
            self.path = os.path.abspath(self.given)
            if not os.path.isdir(self.path):
                raise ValueError(f"workspace {self.given!r} is not an existing directory")
        self.original = os.stat(self.path)
        for name, text in self.files.items():
            write_file(self.path, name, text)
        if self.uid is not None:
            keep = _keep_paths(self.path, self.protected)
            chown_contents(self.path, self.uid, self.uid, keep)
            os.chown(self.path, self.original.st_uid, self.uid)
            os.chmod(self.path, 0o1770 if keep else 0o770)
            _protect(self.path, keep)
        return self.path

    def __exit__(self, *exc) -> None:
        if self.given is None:
            remove_tree(self.path)
            return
        if self.uid is not None:
            chown_contents(self.path, self.original.st_uid, self.original.st_gid)
            os.chown(self.path, self.original.st_uid, self.original.st_gid)
        # A program running as tidal's own user may have chmod-ed the directory, or (subprocess
        # backend) even replaced it; restore the mode of what is still the same directory.
        if os.path.isdir(self.path) and not os.path.islink(self.path):
            os.chmod(self.path, stat.S_IMODE(self.original.st_mode))


def check_file_name(name: str) -> None:
    path = PurePosixPath(name)
    if path.is_absolute() or not path.parts or ".." in path.parts:
        raise ValueError(f"file name {name!r} must be a relative path inside the workspace")


def write_file(root: str, name: str, text: str) -> None:
    """Write root/name, replacing whatever is in the way, never following a symlink."""
    check_file_name(name)
    path = PurePosixPath(name)
    dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in path.parts[:-1]:
            if not _is_real_dir(dir_fd, part):
                _remove_entry(dir_fd, part)
                os.mkdir(part, 0o755, dir_fd=dir_fd)
            child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = child
        _remove_entry(dir_fd, path.name)
        fd = os.open(path.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644,
                     dir_fd=dir_fd)
        with open(fd, "w", encoding="utf-8") as f:
            f.write(text)
    finally:
        os.close(dir_fd)


def chown_contents(root: str, uid: int, gid: int, keep: frozenset[str] = frozenset()) -> None:
    """chown everything under root but `keep` (host paths), links themselves rather than their
    targets."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if path not in keep:
                os.chown(path, uid, gid, follow_symlinks=False)


def _keep_paths(root: str, protected: tuple[str, ...]) -> frozenset[str]:
    """Host paths of the protected files that are regular files here, and their parent dirs."""
    keep = set()
    for name in protected:
        path = os.path.join(root, name)
        if not os.path.isfile(path) or os.path.islink(path):
            continue  # gone or replaced (by an earlier run of a rollout without a fresh uid)
        keep.add(path)
        parent = os.path.dirname(path)
        while parent != root:
            keep.add(parent)
            parent = os.path.dirname(parent)
    return frozenset(keep)


def _protect(root: str, keep: frozenset[str]) -> None:
    for path in keep:
        if os.path.isdir(path):
            os.chmod(path, 0o1777)
        else:
            os.chmod(path, 0o444)


def remove_tree(root: str) -> None:
    """Delete a workspace, even one whose program made its directories unreadable to us."""
    # Only a program running as tidal's own user (the subprocess backend when tidal is not
    # root) can replace its workspace by a link or delete it.
    if os.path.islink(root):
        os.unlink(root)
        return
    if not os.path.exists(root):
        return
    if os.geteuid() != 0:  # root ignores modes; anyone else must first undo a chmod 000
        _make_dirs_writable(root)
    shutil.rmtree(root)


def _make_dirs_writable(path: str) -> None:
    os.chmod(path, 0o700)
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            _make_dirs_writable(entry.path)


def _is_real_dir(dir_fd: int, name: str) -> bool:
    info = _lstat(dir_fd, name)
    return info is not None and stat.S_ISDIR(info.st_mode)


def _remove_entry(dir_fd: int, name: str) -> None:
    info = _lstat(dir_fd, name)
    if info is None:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
