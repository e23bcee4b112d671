"""Read a rollout's workspace host-side, as the rollout left it, and check its protected files.

Why: integrity checking compares the workspace after an episode with the task's image, and the
reward must never come from anything the agent could write; so tidal reads the files itself,
outside any sandbox, without following anything the program planted.

An overlay workspace is merged the way overlayfs shows it: the upper layer (the rollout's dir)
over the image. In the upper layer a character device 0/0 is a whiteout (the file was deleted),
and a directory marked opaque (xattr trusted.overlay.opaque or user.overlay.opaque = "y") hides
everything below it in the image. (redirect_dir and metacopy, off in bwrap's mounts, are not
read.) A copy workspace is walked as it is.

Never followed: a symlink is reported as the text "symlink -> TARGET", not read. Other special
files (fifos, sockets, devices) are skipped. Undecodable bytes are replaced (U+FFFD). Reading
stops at `max_bytes` of text in all; the dict then holds TRUNCATED (a key no workspace file can
have: it is absolute) saying so, and files past the cut are absent.
"""

from __future__ import annotations

import os
import stat

from tidal.sandbox.image import TaskImage, text_sha256

TRUNCATED = "/tidal-files-truncated"
"""Key present in files() output when max_bytes cut it short."""
SYMLINK = "symlink -> "
OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque")


def read_tree(upper: str, lower: str | None, max_bytes: int) -> dict[str, str]:
    """Relative path -> text of `upper` merged over `lower` (None: upper alone), sorted by path."""
    out: dict[str, str] = {}
    budget = [max_bytes]
    _merge(upper, lower, "", out, budget)
    return out


def changed_protected(image: TaskImage, files: dict[str, str]) -> list[str]:
    """The image's protected paths whose text in `files` (Rollout.files()) differs from the
    image's by sha256, or that are missing (deleted, or cut off by max_bytes)."""
    return [name for name in image.protected
            if name not in files or text_sha256(files[name]) != image.protected_sha256[name]]


def _merge(upper: str | None, lower: str | None, rel: str, out: dict, budget: list) -> None:
    names: dict[str, tuple[str | None, str | None]] = {}
    for side, root in ((0, upper), (1, lower)):
        if root is None:
            continue
        for name in _list(root):
            pair = names.get(name, (None, None))
            names[name] = (os.path.join(root, name), pair[1]) if side == 0 else (
                pair[0], os.path.join(root, name))
    for name in sorted(names):
        if TRUNCATED in out:
            return
        up, low = names[name]
        path = f"{rel}{name}"
        if up is not None:
            info = os.lstat(up)
            if stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:
                continue  # whiteout: deleted in this rollout
            if stat.S_ISDIR(info.st_mode):
                hides = low is None or not os.path.isdir(low) or os.path.islink(low) \
                    or _opaque(up)
                _merge(up, None if hides else low, path + "/", out, budget)
                continue
            _one(up, info, path, out, budget)
        else:
            info = os.lstat(low)
            if stat.S_ISDIR(info.st_mode):
                _merge(None, low, path + "/", out, budget)
            else:
                _one(low, info, path, out, budget)


def _list(root: str) -> list[str]:
    try:
        return os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _opaque(path: str) -> bool:
    for name in OPAQUE_XATTRS:
        try:
            if os.getxattr(path, name, follow_symlinks=False) == b"y":
                return True
        except OSError:
            pass
    return False


def _one(host: str, info: os.stat_result, path: str, out: dict, budget: list) -> None:
    if stat.S_ISLNK(info.st_mode):
        text = SYMLINK + os.readlink(host)
    elif stat.S_ISREG(info.st_mode):
        text = _read(host, budget[0] + 1)
    else:
        return  # fifo, socket, device: nothing to read
    if len(text.encode("utf-8", "surrogatepass")) > budget[0]:
        out[TRUNCATED] = f"files() stopped before {path}: more than max_bytes of text in all"
        return
    budget[0] -= len(text.encode("utf-8", "surrogatepass"))
    out[path] = text


def _read(path: str, limit: int) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")
