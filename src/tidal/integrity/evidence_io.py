"""Evidence from disk: two workspace directories and JSON-lines action / trace files.

Used by ``tidal integrity check``. Text files are read (binary ones skipped: a NUL byte or
text that is not UTF-8), symlinks are never followed (a link inside the workspace could point
anywhere on this machine), and any unreadable input raises ``EvidenceError`` naming the path
and, for JSON lines, the line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tidal.errors import UserError
from tidal.evidence.records import Action, Evidence, TraceEvent

MAX_FILE_BYTES = 2_000_000
"""Files larger than this are skipped (no source file an agent writes is this big)."""


class EvidenceError(UserError):
    """Evidence on disk that cannot be read: the message names the file (and line)."""


def evidence_from_paths(before_dir, after_dir, actions_file=None, trace_file=None,
                        protected=(), hidden=()) -> Evidence:
    """The Evidence of an episode from its workspace before and after (directories), its
    actions and its sandbox trace (JSON lines of Action / TraceEvent objects)."""
    trace = read_jsonl(trace_file, TraceEvent.from_json) if trace_file else []
    return Evidence(before=read_tree(before_dir), after=read_tree(after_dir),
                    actions=read_jsonl(actions_file, Action.from_json) if actions_file else [],
                    trace=trace, protected=tuple(clean_rel(p) for p in protected),
                    hidden=tuple(clean_rel(p) for p in hidden), trace_recorded=trace_file is not None)


def clean_rel(path: str) -> str:
    return str(path).removeprefix("/workspace/").removeprefix("./")


def read_tree(directory) -> dict[str, str]:
    """relative path -> text of every regular text file under ``directory`` (symlinks, binary
    and oversized files skipped)."""
    root = Path(directory)
    if not root.exists():
        raise EvidenceError(f"{root}: no such directory")
    if not root.is_dir() or root.is_symlink():
        raise EvidenceError(f"{root}: not a directory")
    out: dict[str, str] = {}

    def fail(err: OSError):
        raise EvidenceError(f"{err.filename or root}: cannot read the directory ({err.strerror or err})")

    for dirpath, dirnames, filenames in os.walk(root, onerror=fail, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
        for name in sorted(filenames):
            path = Path(dirpath, name)
            if path.is_symlink() or not path.is_file():
                continue
            text = read_text(path)
            if text is not None:
                out[path.relative_to(root).as_posix()] = text
    return out


def read_text(path: Path) -> str | None:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return None
        data = path.read_bytes()
    except OSError as e:
        raise EvidenceError(f"{path}: cannot read ({e.strerror or e})") from None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def read_jsonl(path, make) -> list:
    """One record per non-blank line; a line that is not a JSON object of the record's shape
    is an error naming the file and the line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise EvidenceError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise EvidenceError(f"{p}: is a directory, not a JSON-lines file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise EvidenceError(f"{p}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            raise EvidenceError(f"{p}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(data, dict):
            raise EvidenceError(f"{p}:{n}: expected a JSON object, got {type(data).__name__}")
        try:
            out.append(make(data))
        except (TypeError, ValueError, KeyError) as e:
            raise EvidenceError(f"{p}:{n}: not a valid record ({e})") from None
    return out
