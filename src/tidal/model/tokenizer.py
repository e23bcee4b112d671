"""Tokenizers: a byte-level one for the built-in tasks, or a Hugging Face one from a checkpoint.

Both expose the same small interface (``encode``, ``decode``, ``bos_id``, ``eos_id``,
``pad_id``, ``vocab_size``, ``adds_bos``, ``has_chat_template``, ``end_of_turn_id``), so the
engine and trainer never care which is in use. A Hugging Face tokenizer with a chat template
also renders chat messages (``render_chat``, ``encode_chat``) exactly as transformers'
``apply_chat_template`` does, by calling it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path


class ByteTokenizer:
    """UTF-8 bytes 0..255 plus four specials. No training, no files, exact round trip."""

    pad_id = 256
    bos_id = 257
    eos_id = 258
    unk_id = 259
    vocab_size = 260
    adds_bos = True
    has_chat_template = False
    end_of_turn_id = eos_id

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def save(self, folder: str | Path) -> None:
        (Path(folder) / "tidal_tokenizer.txt").write_text("byte\n")


EOS_GUESSES = ("<|endoftext|>", "</s>", "<eos>")
BOS_GUESSES = ("<|im_start|>", "<s>", "<bos>")
PAD_GUESSES = ("<|pad|>", "<pad>")
"""Special tokens looked up by name when a folder has no tokenizer_config.json naming them."""

CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
"""Files beside tokenizer.json that HFTokenizer reads (or transformers does) and save copies."""


class HFTokenizer:
    """A ``tokenizers`` tokenizer.json from a Hugging Face checkpoint folder, with the special
    tokens and chat template its tokenizer_config.json names (chat_template.jinja also counts).

    Invariants: ``eos_id``, ``bos_id`` and ``pad_id`` are ids in the vocabulary. ``eos_id`` is
    the config's eos_token, the token a chat model ends its turn with (``end_of_turn_id``, what
    the engine stops on). A config whose bos_token is null (Qwen) sets ``adds_bos = False``:
    ``encode(text, add_bos=True)`` then adds nothing, and ``bos_id`` falls back to ``eos_id``
    (a document separator for callers that need one). Special-token strings in text (e.g.
    ``<|im_start|>``) encode to their single id."""

    def __init__(self, folder: str | Path):
        from tokenizers import Tokenizer

        self._folder = Path(folder)
        self._tok = Tokenizer.from_file(str(self._folder / "tokenizer.json"))
        self.vocab_size = self._tok.get_vocab_size()
        vocab = self._tok.get_vocab()
        config = _tokenizer_config(self._folder)
        eos = _named_token(config, "eos_token", vocab) or _guess(EOS_GUESSES, vocab)
        self.eos_id = vocab[eos] if eos else 0
        self.end_of_turn_token: str = eos or self._tok.id_to_token(self.eos_id)
        """The token that ends a chat turn (the chat template's eos_token)."""
        self.end_of_turn_id = self.eos_id
        if config.get("bos_token", "absent") is None:  # named, and named as none
            bos, self.adds_bos = None, False
        else:
            bos = _named_token(config, "bos_token", vocab) or _guess(BOS_GUESSES, vocab)
            self.adds_bos = True
        self.bos_id = vocab[bos] if bos else self.eos_id
        pad = _named_token(config, "pad_token", vocab) or _guess(PAD_GUESSES, vocab)
        self.pad_id = vocab[pad] if pad else self.eos_id
        self.chat_template = _chat_template(config, self._folder)
        """The template (a string, or {name: template} for a list of named ones), or None."""
        self.has_chat_template = self.chat_template is not None
        self._hf = None  # transformers' tokenizer for this folder, made on first render_chat

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if add_bos and self.adds_bos else ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def render_chat(self, messages: list[dict], tools: list[dict] | None = None,
                    add_generation_prompt: bool = True) -> str:
        """``messages`` rendered by the chat template: what transformers'
        ``apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=...)``
        returns for this folder (it is what renders them)."""
        if not self.has_chat_template:
            raise ValueError(f"{self._folder} has no chat template (tokenizer_config.json "
                             f"'chat_template' or chat_template.jinja); render_chat needs one")
        return self._transformers_tokenizer().apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt)

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None,
                    add_generation_prompt: bool = True) -> list[int]:
        """The ids of ``render_chat(...)``; the template's special tokens become their ids."""
        return self.encode(self.render_chat(messages, tools, add_generation_prompt))

    def save(self, folder: str | Path) -> None:
        """tokenizer.json, and the files beside it that name its special tokens and chat template
        (a saved checkpoint keeps its eos and template)."""
        folder = Path(folder)
        self._tok.save(str(folder / "tokenizer.json"))
        if folder.resolve() != self._folder.resolve():
            for name in CONFIG_FILES:
                if (self._folder / name).is_file():
                    shutil.copyfile(self._folder / name, folder / name)

    def _transformers_tokenizer(self):
        """transformers' fast tokenizer for this folder (what AutoTokenizer loads), built once."""
        if self._hf is None:
            from transformers import PreTrainedTokenizerFast

            self._hf = PreTrainedTokenizerFast.from_pretrained(str(self._folder))
        return self._hf


def _tokenizer_config(folder: Path) -> dict:
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return {}
    from tidal.model.checkpoint import CheckpointError

    try:
        config = json.loads(path.read_text())
    except ValueError as e:
        raise CheckpointError(f"{path} is not valid JSON ({e}); fix or remove it") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} must hold a JSON object, not {type(config).__name__}")
    return config


def _named_token(config: dict, key: str, vocab: dict[str, int]) -> str | None:
    """The token tokenizer_config.json names under ``key`` (a string or {"content": ...}),
    if it is in the vocabulary."""
    value = config.get(key)
    token = value.get("content") if isinstance(value, dict) else value
    return token if isinstance(token, str) and token in vocab else None


def _guess(names: tuple[str, ...], vocab: dict[str, int]) -> str | None:
    return next((t for t in names if t in vocab), None)


def _chat_template(config: dict, folder: Path) -> str | dict | None:
    """tokenizer_config.json's chat_template (a string, or a list of {name, template}), else the
    text of chat_template.jinja, else None."""
    value = config.get("chat_template")
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return {t["name"]: t["template"] for t in value}
    jinja = folder / "chat_template.jinja"
    return jinja.read_text() if jinja.is_file() else None


def load_tokenizer(folder: str | Path | None = None) -> ByteTokenizer | HFTokenizer:
    """The tokenizer stored with a checkpoint; the byte tokenizer if there is none."""
    if folder is not None and (Path(folder) / "tokenizer.json").is_file():
        return HFTokenizer(folder)
    return ByteTokenizer()
