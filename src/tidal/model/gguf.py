"""A GGUF file (llama.cpp's format) converted into a Hugging Face safetensors checkpoint folder.

Why this exists: transformers reads a GGUF file (``from_pretrained(folder, gguf_file=name)``
dequantizes every tensor to float) but refuses to ``save_pretrained`` the model it loaded that
way, and that model's config keeps a ``quantization_config`` naming the GGUF file, so a folder
saved from it could not be loaded without the file. So we let transformers read the file, then
rebuild a clean model: a fresh config without ``quantization_config`` (dtype float32), a fresh
model of the same class, the dequantized tensors loaded into it, saved as safetensors; the
tokenizer (with its chat template) is saved beside it. The result loads like any published
checkpoint, in transformers and in tidal.

Reading and dequantizing needs the ``gguf`` and ``accelerate`` packages (core dependencies).
Nothing here caches or writes atomically: tidal.model.sources does both.
"""

from __future__ import annotations

import json
from pathlib import Path

GGUF_MAGIC = b"GGUF"
"""The first four bytes of every GGUF file."""


def is_gguf(path: Path) -> bool:
    """Whether ``path`` is a file that starts with the GGUF magic bytes."""
    with open(path, "rb") as f:
        return f.read(len(GGUF_MAGIC)) == GGUF_MAGIC


def convert_gguf(gguf_path: Path, out: Path) -> Path:
    """Write the float32 Hugging Face checkpoint of ``gguf_path`` into the folder ``out``
    (created if missing): config.json, generation_config.json, model.safetensors, tokenizer.json
    and tokenizer_config.json with the chat template in it. Returns ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    folder, name = str(gguf_path.parent), gguf_path.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    model = _rebuilt_without_quantization(loaded)
    del loaded
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # save_jinja_files=False keeps the chat template inside tokenizer_config.json (transformers 5
    # would otherwise write chat_template.jinja beside it, which older readers do not look for)
    tokenizer.save_pretrained(out, save_jinja_files=False)
    _name_portable_tokenizer_class(out / "tokenizer_config.json")
    return out


def _name_portable_tokenizer_class(tokenizer_config: Path) -> None:
    """transformers 5 names its fast tokenizer ``TokenizersBackend``, a class transformers 4.x
    (and so a vLLM pinned to it) does not know; ``PreTrainedTokenizerFast`` is the same class in
    5 (an alias) and the fast tokenizer in 4.x."""
    config = json.loads(tokenizer_config.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tokenizer_config.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _rebuilt_without_quantization(loaded):
    """A fresh model of ``loaded``'s class holding its (dequantized, float32) weights, with a
    config that no longer mentions the GGUF file."""
    import torch

    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    for name_of_source in ("_name_or_path", "_model_name_or_path"):  # the GGUF's general.name
        config_dict.pop(name_of_source, None)
    config_dict["dtype"] = "float32"
    config = type(loaded.config).from_dict(config_dict)
    state = {k: v.detach().to(torch.float32) for k, v in loaded.state_dict().items()}
    model = type(loaded)(config).to(torch.float32)
    model.load_state_dict(state, strict=True)
    return model.eval()
