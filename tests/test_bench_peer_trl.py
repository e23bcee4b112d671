"""The TRL peer arm of `tidal bench peer`: its reward is tidal's grader of the assistant's text,
its budget stops training, and end to end in its own process on a tiny random Llama it trains
to its step cap, counts what it graded, and saves a policy transformers loads."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import transformers

from tidal.bench.peer_trl import FuncsReward, PeerSpec, WallBudget, instruct_funcs
from tidal.families.funcs import sample_tasks
from tidal.sandbox import Sandbox, SandboxConfig

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_chat_llama(folder):
    """A byte-level tokenizer (256 bytes + ChatML's two specials) and a random 2-layer Llama."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    hf_tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
        pad_token="<|im_end|>", chat_template=CHATML)
    hf_tok.save_pretrained(folder)
    cfg = transformers.LlamaConfig(
        vocab_size=len(hf_tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=hf_tok.bos_token_id, eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id, tie_word_embeddings=True)
    transformers.set_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


def answer(text):
    return [{"role": "assistant", "content": text}]


def test_reward_grades_the_assistant_text_with_tidals_grader_and_counts_it():
    tasks = sample_tasks(instruct_funcs(), 2, 5, heldout=False)
    solved = "Here it is:\n```python\ndef f(x):\n" + tasks[0].reference_solution + "```\n"
    with Sandbox(SandboxConfig()) as sandbox:
        reward = FuncsReward(sandbox, tasks)
        got = reward(completions=[answer(solved), answer(solved), answer("no code")],
                     task_id=[tasks[0].task_id, tasks[1].task_id, tasks[0].task_id],
                     completion_ids=[[1, 2, 3], [4], [5, 6]], trainer_state=None)
    assert got == [1.0, 0.0, 0.0]  # task 0's solution fails task 1: graded against its own task
    assert (reward.completions, reward.tokens) == (3, 6)


def test_wall_budget_stops_only_after_a_step_ends_past_it():
    control = SimpleNamespace(should_training_stop=False)
    budget = WallBudget(budget_s=3600)
    budget.on_step_begin(None, None, control)
    budget.on_step_end(None, None, control)
    assert not control.should_training_stop and budget.wall_s > 0
    spent = WallBudget(budget_s=0.0)
    spent.on_step_begin(None, None, control)
    spent.on_step_end(None, None, control)
    assert control.should_training_stop


@pytest.mark.slow
def test_trl_arm_trains_counts_and_saves_a_loadable_policy(tmp_path):
    pytest.importorskip("trl", reason="trl is the optional peer extra (pip install '.[peer]')")
    ckpt = tiny_chat_llama(tmp_path / "ckpt")
    spec = {"checkpoint": str(ckpt), "save_to": str(tmp_path / "policy"), "train_seed": 3,
            "train_tasks": 8, "group": 2, "prompts_per_step": 2, "max_completion_tokens": 8,
            "temperature": 1.0, "learning_rate": 1e-3, "wall_budget_s": 600, "torch_threads": 1,
            "seed": 0, "max_steps": 2}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "result.json"
    subprocess.run([sys.executable, "-m", "tidal.bench.peer_trl", "--spec",
                    str(tmp_path / "spec.json"), "--out", str(out)], check=True, timeout=300)

    r = json.loads(out.read_text())
    assert r["steps"] == 2  # the step cap ends it; the budget (600 s) is never reached
    assert r["completions"] == r["steps"] * 4  # a step: prompts_per_step * group, graded once
    assert 0 < r["completion_tokens"] <= r["completions"] * 8
    assert r["grpo_config"]["generation_batch_size"] == 4
    assert r["train_wall_s"] > 0 and r["completions_per_min"] > 0 and r["peak_rss_mb"] > 0
    assert len(r["mean_reward_per_step"]) == r["steps"]

    policy = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "policy")
    start = transformers.AutoModelForCausalLM.from_pretrained(ckpt)
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "policy").chat_template == CHATML
    names = [n for n, _ in policy.named_parameters()]
    assert names == [n for n, _ in start.named_parameters()]

def test_spec_refuses_completion_style_prompts():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="instruct"):
        PeerSpec(checkpoint="x", save_to="y", funcs={"prompt_style": "code"})
