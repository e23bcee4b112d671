"""Mid-training corpus: read documents from files, pack them into fixed-length token rows.

File formats (chosen by suffix):
- ``.jsonl``: one JSON object per line with a string ``"text"`` field; blank lines are skipped.
- anything else (``.txt``, ``.py``, ...): the whole file is **one** document. Code is full of
  blank lines (between functions, inside bodies), so splitting on them would cut programs apart;
  to put many documents in one file, use JSONL.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from tidal.errors import UserError
from tidal.model.tokenizer import ByteTokenizer


class CorpusError(UserError, ValueError):
    """A corpus file the user named cannot be read; the message names the file (and line)."""


def load_corpus(paths: list[str | Path]) -> list[str]:
    """All documents of all files, in order."""
    if not paths:
        raise CorpusError("no corpus files given; set pretrain.corpus to JSONL or text files")
    docs: list[str] = []
    for p in map(Path, paths):
        if not p.is_file():
            raise CorpusError(f"corpus file not found: {p} (check pretrain.corpus)")
        docs.extend(_read_jsonl(p) if p.suffix == ".jsonl" else [_read_text(p)])
    return docs


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise CorpusError(f"corpus file {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def _read_jsonl(path: Path) -> list[str]:
    docs = []
    for n, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise CorpusError(f"{path}:{n}: not valid JSON ({e.msg}); each line must be one JSON object") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise CorpusError(f'{path}:{n}: expected a JSON object with a string "text" field')
        docs.append(obj["text"])
    return docs


def pack(docs: list[str], tokenizer, seq_len: int) -> torch.Tensor:
    """Tokenize each doc as ``bos + tokens + eos``, concatenate, cut into rows of seq_len tokens.

    Returns LongTensor [N, seq_len]; the ragged tail (< seq_len tokens) is dropped. Documents
    run across row boundaries (standard packing: no padding, every position is trained).
    """
    stream = _token_stream(docs, tokenizer)
    n = len(stream) // seq_len
    if n == 0:
        raise CorpusError(
            f"the corpus has {len(stream)} tokens, fewer than one row of pretrain.seq_len = {seq_len}; "
            "add documents or lower pretrain.seq_len"
        )
    return torch.from_numpy(stream[: n * seq_len].reshape(n, seq_len).astype(np.int64))


def _token_stream(docs: list[str], tokenizer) -> np.ndarray:
    """One flat int32 array of every doc's bos + ids + eos. The byte tokenizer's ids are the UTF-8
    bytes, so its path is vectorised (60k docs in milliseconds, not seconds)."""
    bos, eos = tokenizer.bos_id, tokenizer.eos_id
    if isinstance(tokenizer, ByteTokenizer):
        encoded = [d.encode("utf-8") for d in docs]
        lengths = np.fromiter((len(b) + 2 for b in encoded), dtype=np.int64, count=len(encoded))
        out = np.empty(int(lengths.sum()), dtype=np.int32)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        out[starts] = bos
        out[starts + lengths - 1] = eos
        body = np.ones(len(out), dtype=bool)
        body[starts] = False
        body[starts + lengths - 1] = False
        out[body] = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        return out
    ids: list[int] = []
    for d in docs:
        ids.append(bos)
        ids.extend(tokenizer.encode(d))
        ids.append(eos)
    return np.asarray(ids, dtype=np.int64)
