"""Tokenizers: a byte-level one for the built-in tasks, or a Hugging Face one from a checkpoint.

Both expose the same small interface (``encode``, ``decode``, ``bos_id``, ``eos_id``,
``pad_id``, ``vocab_size``), so the engine and trainer never care which is in use.
"""

from __future__ import annotations

from pathlib import Path


class ByteTokenizer:
    """UTF-8 bytes 0..255 plus four specials. No training, no files, exact round trip."""

    pad_id = 256
    bos_id = 257
    eos_id = 258
    unk_id = 259
    vocab_size = 260

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def save(self, folder: str | Path) -> None:
        (Path(folder) / "tidal_tokenizer.txt").write_text("byte\n")


class HFTokenizer:
    """A ``tokenizers`` tokenizer.json from a Hugging Face checkpoint folder."""

    def __init__(self, folder: str | Path):
        from tokenizers import Tokenizer

        path = Path(folder) / "tokenizer.json"
        self._tok = Tokenizer.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size()
        vocab = self._tok.get_vocab()
        self.eos_id = next((vocab[t] for t in ("<|endoftext|>", "</s>", "<eos>") if t in vocab), 0)
        self.bos_id = next((vocab[t] for t in ("<|im_start|>", "<s>", "<bos>") if t in vocab), self.eos_id)
        self.pad_id = next((vocab[t] for t in ("<|pad|>", "<pad>") if t in vocab), self.eos_id)
        self._folder = Path(folder)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def save(self, folder: str | Path) -> None:
        self._tok.save(str(Path(folder) / "tokenizer.json"))


def load_tokenizer(folder: str | Path | None = None) -> ByteTokenizer | HFTokenizer:
    """The tokenizer stored with a checkpoint; the byte tokenizer if there is none."""
    if folder is not None and (Path(folder) / "tokenizer.json").is_file():
        return HFTokenizer(folder)
    return ByteTokenizer()
