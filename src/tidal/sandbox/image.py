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
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile

from tidal.sandbox.workspace import check_file_name, remove_tree, write_file

IMAGE_PREFIX = "tidal-image-"


class TaskImage:
    """A private, read-only-by-convention directory tree; `path` is what rollouts layer over."""

    def __init__(self, path: str, owner_dir: str):
        self.path = path
        """Host path of the image's root directory."""
        self._owner_dir = owner_dir

    @classmethod
    def from_files(cls, files: dict[str, str]) -> "TaskImage":
        """An image holding `files` (relative path -> text)."""
        for name in files:
            check_file_name(name)
        image = cls._empty()
        for name, text in files.items():
            write_file(image.path, name, text)
        _open_up_modes(image.path)
        return image

    @classmethod
    def from_dir(cls, source: str) -> "TaskImage":
        """An image holding a copy of the directory `source` (symlinks copied as links)."""
        if not os.path.isdir(source):
            raise ValueError(f"task image source {source!r} is not an existing directory")
        image = cls._empty()
        os.rmdir(image.path)
        shutil.copytree(source, image.path, symlinks=True)
        _open_up_modes(image.path)
        return image

    @classmethod
    def _empty(cls) -> "TaskImage":
        owner_dir = tempfile.mkdtemp(prefix=IMAGE_PREFIX)  # 0700: the image's modes stay private
        path = os.path.join(owner_dir, "image")
        os.mkdir(path)
        return cls(path, owner_dir)

    def close(self) -> None:
        """Delete the image (rollouts over it must be closed first)."""
        if os.path.exists(self._owner_dir):
            remove_tree(self._owner_dir)

    def __enter__(self) -> "TaskImage":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
