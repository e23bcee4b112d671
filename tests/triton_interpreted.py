"""Run tidal's Triton kernels through Triton's interpreter on CPU tensors; print JSON.

    TRITON_INTERPRET=1 TIDAL_OPS=gpu python tests/triton_interpreted.py checks|fused|model

Started by tests/test_kernels.py in a fresh process, because TRITON_INTERPRET must be set
before triton is first imported (importing tidal.kernels then applies
tidal/kernels/interpreter.py's patches, which make the interpreter compute what the compiled
kernels do). ``checks``: the device kernel checks at small sizes; ``fused``: fused.py's kernels
against the torch ops they replace; ``model``: the Triton op set through tidal's model
(CausalLM) on the tiny numerics-gpu MoE.
"""

import json
import os
import sys

import torch


def fused_against_torch() -> dict:
    """fused.py's kernels against the torch ops they replace: expert alignment and routing
    exactly, the combine bitwise (same fp32 order, same rounding)."""
    from tidal.kernels import fused, routing
    from tidal.numerics.moe import route

    torch.manual_seed(0)
    out = {}
    out["align_equal"] = all(
        all(torch.equal(a, b) for a, b in zip(routing.align_by_expert(ids, e, 64),
                                              fused.align_by_expert(ids, e, 64)))
        for ids, e in ((torch.randint(0, e, (a,)), e) for a, e in ((1, 8), (150, 8), (600, 5))))
    logits = torch.randn(13, 8)
    want_ids, want_gates, _ = route(logits, 2, True, None, torch.float32)
    ids, gates, own = fused.route(logits, 2, True, None)
    replayed, replay_gates, replay_own = fused.route(logits, 2, True, want_ids.flip(-1))
    out["route_ids_equal"] = (torch.equal(ids, want_ids) and torch.equal(own, want_ids)
                              and torch.equal(replayed, want_ids.flip(-1))
                              and torch.equal(replay_own, want_ids))
    out["route_gate_err"] = float(max((gates - want_gates).abs().max(),
                                      (replay_gates - want_gates.flip(-1)).abs().max()))
    y, w, res = torch.randn(40, 48).bfloat16(), torch.rand(10, 4), torch.randn(10, 48).bfloat16()
    terms = (y.view(10, 4, -1).float() * w[..., None]).unbind(1)
    want = res + (((terms[0] + terms[1]) + terms[2]) + terms[3]).bfloat16()  # in top-k order
    out["combine_equal"] = torch.equal(fused.combine(y, w, res), want)
    return out


def model_checks() -> dict:
    """TritonOps through CausalLM (see test_triton_op_set_runs_the_model_close_bitwise_and_with_replay)."""
    from tidal.kernels.triton_ops import TritonOps
    from tidal.model import KVCache, build_model, preset

    out: dict = {}
    ids = torch.randint(0, 260, (2, 7), generator=torch.Generator().manual_seed(0))
    for dtype in ("float32", "bfloat16"):
        cfg = preset("numerics-gpu-tiny").model_copy(update={"dtype": dtype, "num_hidden_layers": 1})
        model = build_model(cfg, seed=0).eval()
        with torch.inference_mode():
            want, want_experts = model(ids, return_experts=True)
            full, experts = model(ids, deterministic=True, return_experts=True)
            assert isinstance(model.fused_weights("deterministic", getattr(torch, dtype)).ops,
                              TritonOps)
            lp = torch.log_softmax(full, -1)
            # a 4-token prefill then decode steps, two slots in reverse order, another at an offset
            cache = KVCache.for_model(cfg, 3, 16)
            steps = [model(ids[:, :4], positions=torch.arange(4).expand(2, 4), cache=cache,
                           slots=range(1, 3), deterministic=True)]
            for p in range(4, 7):
                step = model(ids[:, p : p + 1].flip(0), positions=torch.full((2, 1), p), cache=cache,
                             slots=torch.tensor([2, 1]), deterministic=True)
                steps.append(step.flip(0))
            chunked = torch.log_softmax(torch.cat(steps, 1), -1)
            alone = model(ids[1:, 6:7], positions=torch.tensor([[6]]), cache=cache,
                          slots=torch.tensor([2]), deterministic=True)
        out[dtype] = {
            "max_err": float((full - want).abs().max()),
            "experts_equal": torch.equal(experts.sort(-1).values, want_experts.sort(-1).values),
            "chunked_bitwise": torch.equal(chunked, lp),
            "decode_slots_bitwise": torch.equal(torch.log_softmax(alone[:, 0], -1), lp[1:, 6]),
        }
        if dtype == "float32":
            out["replay"] = replay_checks(model, ids, full, experts)
    return out


def replay_checks(model, ids, full, experts) -> dict:
    """Replay honoured on the Triton op set: the router's own experts change nothing; other
    experts change the logits to what the module forward computes under the same replay."""
    other = (experts + 1) % model.config.num_experts
    with torch.inference_mode():
        own, own_topk = model(ids, deterministic=True, replay_experts=experts, return_experts=True)
        moved, moved_topk = model(ids, deterministic=True, replay_experts=other, return_experts=True)
        want = model(ids, replay_experts=other)
    return {"own_bitwise": torch.equal(own, full), "other_differs": not torch.equal(moved, full),
            "other_err": float((moved - want).abs().max()),
            "own_topk_kept": torch.equal(moved_topk, experts) and torch.equal(own_topk, experts)}


def main(what: str) -> dict | list:
    assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1"
    os.environ.setdefault("TIDAL_OPS", "gpu")
    torch.set_num_threads(1)
    import tidal.kernels  # noqa: F401 - applies the interpreter patches

    if what == "checks":
        from tidal.kernels.checks import run_kernel_checks, triton_kernels

        return run_kernel_checks("cpu", triton_kernels(), small=True)
    if what == "fused":
        return fused_against_torch()
    return model_checks()


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
