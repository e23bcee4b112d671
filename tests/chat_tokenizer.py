"""A tiny byte-level BPE tokenizer with SmolLM2's specials and ChatML chat template, built in a
test (no model hub here): tests/data/smollm2_chat_template.jinja is the template copied from the
real GGUF file's tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = (Path(__file__).parent / "data" / "smollm2_chat_template.jinja").read_text()
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tiny_tokenizer(folder: Path, config: dict | None = None) -> Path:
    """A byte-level BPE over a few sentences with SmolLM2's specials at ids 0, 1, 2, saved as
    tokenizer.json (plus tokenizer_config.json when ``config`` is given)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = ["You are a helpful AI assistant named SmolLM, trained by Hugging Face",
            "system user assistant tool What is 2+2? You are terse. Let me compute it. 4"]
    tok.train_from_iterator(text * 20, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def chatml_config(**changes) -> dict:
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|im_start|>",
              "eos_token": "<|im_end|>", "pad_token": "<|im_end|>", "unk_token": "<|endoftext|>",
              "chat_template": CHAT_TEMPLATE}
    return {**config, **changes}
