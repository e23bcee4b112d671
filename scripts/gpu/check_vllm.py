"""vLLM through tidal's remote backend on one GPU: the check to run the moment a GPU is lent.

    pip install -e .[vllm]
    python scripts/gpu/check_vllm.py --out vllm_check.json [--dtype bfloat16] [--port 8011]

1. builds a small random-initialised Qwen3-MoE Hugging Face folder here (tidal's own model,
   saved with tidal.model.save_pretrained; no download);
2. launches `vllm serve` on it through tidal's supervisor (tidal.engine.vllm_server: dev mode,
   processed logprobs, no tokenizer: prompts are token ids);
3. generates greedy completions with logprobs through the remote backend (RemoteEngine);
4. scores the same tokens with tidal's trainer forward (deterministic numerics) and with tidal's
   deterministic engine, and prints the engine-vs-trainer mismatch metrics of both
   (tidal.numerics.metrics) side by side;
5. updates the weights (a perturbed copy written to the folder, vLLM reloads it) and repeats 3-4;
6. writes everything as JSON to --out.

Installs nothing; needs only what `pip install -e .[vllm]` brings.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

SRC = Path(__file__).resolve().parents[2] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from tidal.model.config import ModelConfig

MODEL = {"vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
         "moe_intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64, "num_experts": 8, "num_experts_per_tok": 2,
         "max_position_embeddings": 512}
"""A small Qwen3-MoE (every layer sparse, 8 experts, top-2)."""
PROMPTS = 16
PROMPT_LEN = 24
NEW_TOKENS = 32


def build_moe_folder(folder: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """A random-initialised Qwen3-MoE Hugging Face folder (config.json + model.safetensors)."""
    from tidal.model.checkpoint import save_pretrained
    from tidal.model.qwen3 import build_model

    fields = {k: v for k, v in MODEL.items() if k in ModelConfig.model_fields}
    model = build_model(ModelConfig(**fields), seed=seed).to(getattr(torch, dtype))
    save_pretrained(model, folder)
    return folder


def prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(1, vocab - 1, (PROMPT_LEN,), generator=g).tolist() for _ in range(PROMPTS)]


def config(folder: Path, port: int, dtype: str):
    from tidal.config import load_config

    launch = [shutil.which("vllm") or sys.executable] + ([] if shutil.which("vllm") else
                                                         ["-m", "vllm.entrypoints.cli.main"])
    return load_config(None, [
        "--engine.backend", "remote", "--engine.remote.kind", "vllm",
        "--engine.remote.url", f"http://127.0.0.1:{port}", "--engine.remote.weights_dir", str(folder),
        "--engine.remote.launch", "true", "--engine.remote.launch_command", json.dumps(launch + ["serve"]),
        "--engine.remote.launch_args", json.dumps(["--skip-tokenizer-init", "--enforce-eager",
                                                   "--gpu-memory-utilization", "0.3"]),
        "--engine.max_seq_len", "256", "--engine.max_new_tokens", str(NEW_TOKENS),
        "--engine.temperature", "0", "--trainer.router_replay", "off",
        "--model.dtype", dtype, "--trainer.dtype", dtype])


def requests():
    from tidal.engine import GenerationRequest

    return [GenerationRequest(p, temperature=0.0, stop=[], ignore_eos=True, seed=i)
            for i, p in enumerate(prompts(MODEL["vocab_size"]))]


@torch.inference_mode()
def trainer_scores(model, results) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs, experts [tokens, layers, k]) the trainer's deterministic forward gives each
    generated token (greedy: log_softmax at T = 1)."""
    from tidal.numerics.ops import scaled_log_softmax

    lps, exps = [], []
    for r in results:
        ids = torch.tensor([r.prompt_ids + r.token_ids[:-1]], device=next(model.parameters()).device)
        logits, experts = model(ids, return_experts=True, deterministic=True)
        at = slice(len(r.prompt_ids) - 1, ids.shape[1])
        logp = scaled_log_softmax(logits[0, at], 1.0)
        lps.append(logp.gather(1, torch.tensor(r.token_ids, device=logp.device)[:, None])[:, 0].cpu())
        exps.append(experts[0, at].cpu())
    return torch.cat(lps), torch.cat(exps)


def compare(name: str, results, model) -> dict:
    from tidal.numerics.metrics import mismatch_metrics, routing_flip_metrics

    trainer_lp, trainer_exp = trainer_scores(model, results)
    engine_lp = torch.tensor([x for r in results for x in r.logprobs])
    out = {"backend": name, **mismatch_metrics(engine_lp, trainer_lp)}
    if results[0].experts is not None and results[0].experts[0][0][0] >= 0:
        engine_exp = torch.tensor([e for r in results for e in r.experts])
        out["routing"] = routing_flip_metrics(engine_exp, trainer_exp)
    return out


def tidal_engine(folder: Path, dtype: str, cfg):
    from tidal.engine import Engine
    from tidal.model import from_pretrained

    model = from_pretrained(folder, dtype=dtype).to("cuda" if torch.cuda.is_available() else "cpu")
    return Engine(model, _Tok(), cfg.engine), model


class _Tok:
    """No text: prompts are ids and every request ignores eos (vLLM runs without a tokenizer)."""

    eos_id = MODEL["vocab_size"] - 1
    vocab_size = MODEL["vocab_size"]

    def decode(self, ids):
        return ""


def round_(folder: Path, dtype: str, cfg, remote, version: int) -> dict:
    t = time.perf_counter()
    got = remote.generate(requests())
    remote_s = time.perf_counter() - t
    out = {"version": version, "remote_generate_s": remote_s,
           "vllm_versions": sorted({v for r in got for v in r.versions}),
           "vllm_tokens_head": got[0].token_ids[:8]}
    made = guarded(out, "tidal_engine_build", lambda: tidal_engine(folder, dtype, cfg))
    if made is None:
        return out
    engine, model = made
    out["vllm"] = guarded(out, "trainer_vs_vllm", lambda: compare("vllm", got, model))
    local = guarded(out, "tidal_engine_generate", lambda: engine.generate(requests()))
    if local is not None:
        out["tidal_engine"] = guarded(out, "trainer_vs_tidal", lambda: compare("tidal", local, model))
        same = sum(a.token_ids == b.token_ids for a, b in zip(local, got))
        out["greedy_sequences_equal_vllm_vs_tidal"] = f"{same}/{len(got)}"
    return out


def guarded(report: dict, stage: str, fn):
    """Run one stage; a failure is recorded under report["errors"] (the JSON is written anyway)."""
    t = time.perf_counter()
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a check script reports every failure it meets
        report.setdefault("errors", []).append({"stage": stage, "error": f"{type(e).__name__}: {e}"})
        print(f"[{stage}] failed: {type(e).__name__}: {e}", file=sys.stderr)
        return None
    finally:
        report.setdefault("stage_s", {})[stage] = round(time.perf_counter() - t, 3)


def perturbed(init: Path, dtype: str):
    """The next "version": the initial weights plus small noise."""
    from tidal.model import from_pretrained

    model = from_pretrained(init, dtype=dtype)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in model.parameters():
            p.add_((torch.randn(p.shape, generator=g) * 0.02).to(p.dtype))
    return model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_out = str(Path(os.environ.get("OUT", ".")) / "vllm_check.json")
    parser.add_argument("--out", default=default_out)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--work", default="vllm_check_work")
    args = parser.parse_args()
    from tidal.engine.remote.build import remote_engine
    from tidal.model import from_pretrained

    report: dict = {"model": MODEL, "dtype": args.dtype, "prompts": PROMPTS,
                    "new_tokens": NEW_TOKENS, "torch": torch.__version__,
                    "cuda": torch.cuda.is_available()}
    try:
        import vllm

        report["vllm"] = vllm.__version__
    except ImportError:
        print("vllm is not installed: pip install -e .[vllm]", file=sys.stderr)
        return 2
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    init = build_moe_folder(work / "init", dtype=args.dtype)
    served = work / "served"
    cfg = config(served, args.port, args.dtype)
    # launching vLLM through tidal's supervisor: start, GET /health, the engine's probe
    remote = guarded(report, "launch", lambda: remote_engine(cfg, str(init), ""))
    if remote is not None:
        remote.tokenizer = _Tok()
        try:
            rounds = report["rounds"] = []
            if guarded(report, "load_v0", lambda: remote.load_weights(
                    from_pretrained(init, dtype=args.dtype), 0) or True):
                rounds.append(guarded(report, "round_v0",
                                      lambda: round_(served, args.dtype, cfg, remote, 0)))
            if guarded(report, "update_v1", lambda: remote.load_weights(
                    perturbed(init, args.dtype), 1) or True):
                rounds.append(guarded(report, "round_v1",
                                      lambda: round_(served, args.dtype, cfg, remote, 1)))
            if len(rounds) == 2 and all(rounds):
                report["update_changed_tokens"] = (rounds[0]["vllm_tokens_head"]
                                                   != rounds[1]["vllm_tokens_head"])
            report["restarts"] = remote.supervisor.restarts
        finally:
            remote.close()
    report["ok"] = "errors" not in report
    text = json.dumps(report, indent=2)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")
    log = served.parent / f"vllm-{args.port}.log"
    if log.is_file():  # the server's own output, next to the JSON
        shutil.copy2(log, Path(args.out).with_suffix(".vllm.log"))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
