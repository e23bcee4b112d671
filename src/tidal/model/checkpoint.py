"""Hugging Face checkpoint folders: config.json + model.safetensors (or shards with an index).

Reads what transformers writes and what Qwen and Llama-family models publish (model_type
``qwen3`` / ``qwen3_moe`` / ``llama``; a Llama is written back as ``llama``, ``ModelConfig.qk_norm``
False).
MoE experts are accepted per expert (``mlp.experts.7.gate_proj.weight`` — published checkpoints
and transformers 5.x save_pretrained) or fused (``mlp.experts.gate_up_proj`` [E, 2*I, H],
``mlp.experts.down_proj`` [E, H, I] — transformers 5.x in-memory layout); we always write per
expert, the format every transformers version and vLLM load.

Writes are atomic: a temp folder beside the target is filled, the completion marker is written
last, then the folder is renamed into place. Readers that watch a folder wait for the marker.
Every mistake in a folder (missing, malformed, wrong tensors) raises one CheckpointError that
names the file or tensor to fix.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pydantic
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from tidal.errors import UserError
from tidal.fsutil import replace_dir
from tidal.model.config import ModelConfig
from tidal.model.qwen3 import CausalLM

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
COMPLETE_MARKER = "tidal_complete"
"""Empty file written last into a folder we save; its presence means the folder is whole."""

ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                 "llama": "LlamaForCausalLM"}

_SHARED_DEFAULTS = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
                    "initializer_range": 0.02}
HF_DEFAULTS = {
    "qwen3": {**_SHARED_DEFAULTS, "max_position_embeddings": 32768, "head_dim": 128},
    "qwen3_moe": {**_SHARED_DEFAULTS, "max_position_embeddings": 32768, "head_dim": None,
                  "num_experts_per_tok": 8, "norm_topk_prob": False},
    "llama": {**_SHARED_DEFAULTS, "max_position_embeddings": 2048, "head_dim": None},
}
"""transformers' values for keys a config.json may omit, per model_type (Qwen3Config,
Qwen3MoeConfig, LlamaConfig); head_dim None = hidden_size // num_attention_heads."""

_FUSED_EXPERTS = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")
_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")
"""Tensors some old checkpoints store that carry no information (recomputed from rope_theta)."""


class CheckpointError(UserError, ValueError):
    """A checkpoint folder that cannot be loaded; the message names what to fix."""


# ---------------------------------------------------------------- config.json <-> ModelConfig


def config_from_hf(d: dict) -> ModelConfig:
    """A ModelConfig from a Hugging Face config.json dict (qwen3, qwen3_moe or llama)."""
    model_type = d.get("model_type")
    if model_type not in ARCHITECTURES:
        raise CheckpointError(
            f"config.json: model_type {model_type!r} is not supported; supported: {sorted(ARCHITECTURES)}"
        )
    if model_type == "llama" and (d.get("num_experts") or d.get("num_local_experts")):
        raise CheckpointError(
            "config.json: model_type 'llama' is not supported with experts (num_experts / "
            "num_local_experts): tidal's sparse MoE is qwen3_moe only"
        )
    _reject_unsupported_features(d, model_type)
    defaults = HF_DEFAULTS[model_type]

    def get(key: str):
        return d[key] if d.get(key) is not None else defaults[key]

    missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads") if k not in d]
    if model_type == "qwen3_moe":
        missing += [k for k in ("moe_intermediate_size",) if k not in d]
        if "num_experts" not in d and "num_local_experts" not in d:
            missing.append("num_experts")
    if missing:
        raise CheckpointError(f"config.json lacks required keys: {missing}")
    heads = d["num_attention_heads"]
    head_dim = d.get("head_dim") or defaults["head_dim"] or d["hidden_size"] // heads
    rope = d.get("rope_parameters") or {}
    fields = dict(
        vocab_size=d["vocab_size"],
        hidden_size=d["hidden_size"],
        intermediate_size=d["intermediate_size"],
        num_hidden_layers=d["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=d.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        qk_norm=model_type != "llama",
        rope_theta=rope.get("rope_theta") or get("rope_theta"),
        rms_norm_eps=get("rms_norm_eps"),
        max_position_embeddings=get("max_position_embeddings"),
        tie_word_embeddings=get("tie_word_embeddings"),
        initializer_range=get("initializer_range"),
        dtype="bfloat16" if (d.get("dtype") or d.get("torch_dtype")) == "bfloat16" else "float32",
    )
    if model_type == "qwen3_moe":
        fields.update(
            num_experts=d.get("num_experts") or d["num_local_experts"],
            num_experts_per_tok=get("num_experts_per_tok"),
            moe_intermediate_size=d["moe_intermediate_size"],
            norm_topk_prob=get("norm_topk_prob"),
        )
    try:
        return ModelConfig(**fields)
    except pydantic.ValidationError as e:
        raise CheckpointError(f"config.json describes an invalid model: {e}") from None


def _reject_unsupported_features(d: dict, model_type: str) -> None:
    """Variants of the architecture that qwen3.py does not implement: refuse, never ignore."""
    problems = []
    if d.get("attention_bias"):
        problems.append("attention_bias = true")
    if d.get("mlp_bias"):
        problems.append("mlp_bias = true")
    if d.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act = {d['hidden_act']!r} (only 'silu')")
    if d.get("use_sliding_window"):
        problems.append("use_sliding_window = true")
    rope_type = (d.get("rope_parameters") or {}).get("rope_type", "default")
    if rope_type != "default":
        problems.append(f"RoPE scaling (rope_parameters = {d['rope_parameters']}); "
                        "only default RoPE")
    scaling = d.get("rope_scaling")
    if scaling and scaling.get("rope_type", scaling.get("type")) != "default":
        problems.append(f"RoPE scaling (rope_scaling = {scaling}); only default RoPE")
    if model_type == "qwen3_moe":
        if d.get("decoder_sparse_step", 1) != 1 or d.get("mlp_only_layers"):
            problems.append("dense layers inside a MoE model (decoder_sparse_step != 1 or mlp_only_layers)")
    if problems:
        raise CheckpointError(
            f"config.json uses features tidal's model does not support: {'; '.join(problems)}"
        )


def config_to_hf(cfg: ModelConfig, dtype: str | None = None) -> dict:
    """A config.json dict that transformers (4.51+ and 5.x) loads with AutoModelForCausalLM:
    qwen3 / qwen3_moe, or llama when the model has no q/k norms (cfg.qk_norm False)."""
    model_type = "qwen3_moe" if cfg.is_moe else "qwen3" if cfg.qk_norm else "llama"
    dtype = dtype or cfg.dtype
    d = {
        "architectures": [ARCHITECTURES[model_type]],
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "initializer_range": cfg.initializer_range,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "use_cache": True,
        "dtype": dtype,
        "torch_dtype": dtype,
    }
    if model_type == "llama":  # no sliding window; no biases anywhere (what tidal implements)
        del d["use_sliding_window"], d["sliding_window"]
        d.update(mlp_bias=False, pretraining_tp=1)
    if cfg.is_moe:
        d.update(
            num_experts=cfg.num_experts,
            num_experts_per_tok=cfg.num_experts_per_tok,
            moe_intermediate_size=cfg.moe_intermediate_size,
            norm_topk_prob=cfg.norm_topk_prob,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    return d


# ---------------------------------------------------------------- tensor names and layout


def hf_tensor_shapes(cfg: ModelConfig, fused_layers: frozenset[int] = frozenset()) -> dict[str, tuple]:
    """Every tensor a checkpoint of this config holds, with its shape. MoE layers in fused_layers
    use the fused expert names; the others one tensor per expert and projection."""
    with torch.device("meta"):
        internal = {n: tuple(t.shape) for n, t in CausalLM(cfg).state_dict().items()}
    shapes = {}
    for name, shape in internal.items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        m = _FUSED_EXPERTS.match(name)
        if m is None or int(m[1]) in fused_layers:
            shapes[name] = shape
            continue
        experts, rows, cols = shape
        prefix = name.rsplit(".", 1)[0]
        for e in range(experts):
            if m[2] == "gate_up_proj":
                shapes[f"{prefix}.{e}.gate_proj.weight"] = (rows // 2, cols)
                shapes[f"{prefix}.{e}.up_proj.weight"] = (rows // 2, cols)
            else:
                shapes[f"{prefix}.{e}.down_proj.weight"] = (rows, cols)
    return shapes


def to_hf_state_dict(model: CausalLM) -> dict[str, torch.Tensor]:
    """Our parameters under HF names, per-expert, no shared storage (safetensors requires it)."""
    out = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        m = _FUSED_EXPERTS.match(name)
        if m is None:
            out[name] = t.detach().contiguous()
            continue
        prefix = name.rsplit(".", 1)[0]
        for e in range(t.shape[0]):
            if m[2] == "gate_up_proj":
                gate, up = t[e].detach().chunk(2, dim=0)
                out[f"{prefix}.{e}.gate_proj.weight"] = gate.clone()
                out[f"{prefix}.{e}.up_proj.weight"] = up.clone()
            else:
                out[f"{prefix}.{e}.down_proj.weight"] = t[e].detach().clone()
    return out


def _merge_experts(tensors: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Per-expert tensors -> our fused [E, 2*I, H] / [E, H, I] (in place on the dict)."""
    for layer in range(cfg.num_hidden_layers if cfg.is_moe else 0):
        prefix = f"model.layers.{layer}.mlp.experts"
        if f"{prefix}.gate_up_proj" in tensors:
            continue
        gate_up, down = [], []
        for e in range(cfg.num_experts):
            gate = tensors.pop(f"{prefix}.{e}.gate_proj.weight")
            up = tensors.pop(f"{prefix}.{e}.up_proj.weight")
            gate_up.append(torch.cat([gate, up]))
            down.append(tensors.pop(f"{prefix}.{e}.down_proj.weight"))
        tensors[f"{prefix}.gate_up_proj"] = torch.stack(gate_up)
        tensors[f"{prefix}.down_proj"] = torch.stack(down)
    return tensors


# ---------------------------------------------------------------- reading


def checkpoint_config(folder: str | Path) -> ModelConfig:
    """The ModelConfig a checkpoint folder's config.json describes (its dtype, init_from = the
    folder); a CheckpointError naming what to fix."""
    return _read_config(Path(folder))


def _read_config(folder: Path) -> ModelConfig:
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint folder {folder} does not exist (or is not a folder)")
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: a checkpoint folder needs a Hugging Face config.json")
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got {type(d).__name__}")
    return config_from_hf(d).model_copy(update={"init_from": str(folder)})


def _weight_files(folder: Path) -> list[Path]:
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index} is not a valid safetensors index ({e!r})") from None
        files = [folder / name for name in sorted(set(weight_map.values()))]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise CheckpointError(f"{index} names shards that are missing from {folder}: {absent}")
        return files
    if (folder / WEIGHTS_FILE).is_file():
        return [folder / WEIGHTS_FILE]
    present = sorted(p.name for p in folder.iterdir())
    raise CheckpointError(
        f"no {WEIGHTS_FILE} or {INDEX_FILE} in {folder} (found {present}); only safetensors "
        "checkpoints are supported"
    )


def _tensor_locations(files: list[Path]) -> dict[str, tuple[Path, tuple]]:
    """name -> (file, shape), reading only the headers."""
    where = {}
    for path in files:
        try:
            with safe_open(str(path), "pt") as f:
                for name in f.keys():
                    where[name] = (path, tuple(f.get_slice(name).get_shape()))
        except SafetensorError as e:
            raise CheckpointError(
                f"{path} is truncated or corrupt ({e}); re-download or re-save it"
            ) from None
    return where


def _check_layout(where: dict[str, tuple[Path, tuple]], cfg: ModelConfig) -> dict[str, tuple]:
    """Exactly the expected names with the expected shapes, else one error listing them."""
    fused = frozenset(
        int(m[1]) for name in where if (m := _FUSED_EXPERTS.match(name)) and m[2] == "gate_up_proj"
    )
    expected = hf_tensor_shapes(cfg, fused)
    present = {n for n in where if not _IGNORED.match(n)}
    if cfg.tie_word_embeddings:
        present.discard("lm_head.weight")  # tied: the embeddings are the head (as in transformers)
    missing, unexpected = sorted(expected.keys() - present), sorted(present - expected.keys())
    if missing or unexpected:
        raise CheckpointError(
            f"tensor names do not match config.json ({cfg.num_hidden_layers} layers, "
            f"{cfg.num_experts} experts, tied={cfg.tie_word_embeddings}): "
            f"missing {len(missing)} {missing[:5]}, unexpected {len(unexpected)} {unexpected[:5]}"
        )
    for name, shape in expected.items():
        if where[name][1] != shape:
            raise CheckpointError(
                f"tensor {name} in {where[name][0].name} has shape {list(where[name][1])}, "
                f"config.json implies {list(shape)}"
            )
    return expected


def _dtype_name(dtype: str | torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be float32 or bfloat16, got {dtype}")
    return name


def from_pretrained(path: str | Path, dtype: str | torch.dtype | None = None) -> CausalLM:
    """Load a Hugging Face Qwen3 / Qwen3-MoE / Llama folder; dtype None keeps the checkpoint's
    (bf16 or fp32; anything else becomes fp32). The model's config records the folder as
    init_from."""
    folder = Path(path)
    cfg = _read_config(folder)
    if dtype is not None:
        cfg = cfg.model_copy(update={"dtype": _dtype_name(dtype)})
    where = _tensor_locations(_weight_files(folder))
    expected = _check_layout(where, cfg)
    torch_dtype = getattr(torch, cfg.dtype)
    tensors = {}
    for path_ in sorted({where[n][0] for n in expected}):
        with safe_open(str(path_), "pt") as f:
            for name in expected:
                if where[name][0] == path_:
                    tensors[name] = f.get_tensor(name).to(torch_dtype)
    return model_from_hf_tensors(cfg, tensors)


def model_from_hf_tensors(cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> CausalLM:
    """A model around HF-named tensors already in cfg.dtype (no copy): a checkpoint folder's, or
    weights a puller received over the network."""
    tensors = _merge_experts(dict(tensors), cfg)
    if cfg.tie_word_embeddings:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    with torch.device("meta"):
        model = CausalLM(cfg)
    model.load_state_dict(tensors, strict=True, assign=True)
    model.tie_weights()
    return model


# ---------------------------------------------------------------- writing


def save_pretrained(model: CausalLM, path: str | Path, tokenizer=None) -> None:
    """Write config.json + model.safetensors (+ the tokenizer, if given) atomically; an existing
    folder at path is replaced. The dtype recorded is the parameters' actual dtype."""
    folder = Path(path)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".{folder.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    dtype = str(model.model.embed_tokens.weight.dtype).removeprefix("torch.")
    (tmp / CONFIG_FILE).write_text(json.dumps(config_to_hf(model.config, dtype), indent=2) + "\n")
    save_file(to_hf_state_dict(model), str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save(tmp)
    (tmp / COMPLETE_MARKER).write_text("")
    replace_dir(tmp, folder)
