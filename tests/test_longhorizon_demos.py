"""Ledger demonstrations: the scripted expert through the harness's own episode loop."""

import pytest

from tidal.env.toolcall import CALL_CLOSE, CALL_OPEN
from tidal.families.ledger.config import LedgerConfig
from tidal.families.ledger.demos import (demo_rows, demo_segments, harness_for, informative, play_expert,
                                     read_context, segment_text)
from tidal.families.ledger.tasks import parse_code, sample_tasks
from tidal.harness.episode import SUMMARY_CLOSE, SUMMARY_OPEN
from tidal.model.tokenizer import ByteTokenizer

WINDOW = 384
CFG = LedgerConfig(num_files=46)


@pytest.fixture(scope="module")
def clean_episodes():
    tasks = sample_tasks(CFG, 12, 0, False)
    return tasks, play_expert(tasks, WINDOW, 0.0, 0, harness_for(WINDOW, "summarize"))


def test_clean_expert_solves_every_task_over_many_windows(clean_episodes):
    _, results = clean_episodes
    assert all(r.reward == 1.0 for r in results)
    assert all(r.effective_horizon >= 10 for r in results)  # the family's point: >= 8x the window
    assert all(r.resets >= 10 and r.tool_errors == 0 for r in results)


def test_segments_fit_the_window_and_carry_the_summary_forward(clean_episodes):
    tasks, results = clean_episodes
    tok = ByteTokenizer()
    for task, r in zip(tasks, results):
        for before, after in zip(r.segments, r.segments[1:]):
            assert len(before.prompt_ids) + len(before.completion_ids) <= WINDOW
            written = tok.decode(before.completion_ids).rsplit(SUMMARY_OPEN, 1)[1]
            carried, _ = read_context(tok.decode(after.prompt_ids))
            assert written == carried + SUMMARY_CLOSE
            assert parse_code(carried) == list(task.spec[: len(parse_code(carried))])
        assert parse_code(carried) == list(task.spec)  # every step survived every reset


def test_only_calls_and_summaries_are_model_tokens(clean_episodes):
    _, results = clean_episodes
    tok = ByteTokenizer()
    for seg in results[0].segments:
        model = tok.decode([t for t, m in zip(seg.completion_ids, seg.loss_mask) if m])
        env = tok.decode([t for t, m in zip(seg.completion_ids, seg.loss_mask) if not m])
        assert model.replace(CALL_OPEN, "").replace(CALL_CLOSE, "").count("<obs>") == 0
        assert "<obs>" in env or SUMMARY_OPEN in env
        assert model.count(CALL_OPEN) == model.count(CALL_CLOSE)


def test_truncation_loses_the_steps_by_construction():
    tasks = sample_tasks(CFG, 6, 1, False)
    results = play_expert(tasks, WINDOW, 0.0, 0, harness_for(WINDOW, "truncate"))
    # The same expert, reading only what the sliding window still shows, cannot write f.
    assert all(r.reward == 0.0 for r in results)
    assert all(r.effective_horizon >= 8 for r in results)


def test_slips_make_some_demonstrations_fail():
    tasks = sample_tasks(CFG, 40, 2, False)
    results = play_expert(tasks, WINDOW, 0.05, 0, harness_for(WINDOW, "summarize"))
    solved = sum(r.reward for r in results) / len(results)
    assert 0.2 < solved < 0.9


def test_rows_hold_one_segment_each_trained_on_the_expert_tokens_only(clean_episodes):
    _, results = clean_episodes
    segments = results[0].segments
    pad = ByteTokenizer().pad_id
    ids, mask = demo_rows(segments, WINDOW, pad)
    assert ids.shape == mask.shape == (len(segments), WINDOW)
    for row, m, seg in zip(ids, mask, segments):
        n = len(seg.prompt_ids) + len(seg.completion_ids)
        assert row[:n].tolist() == seg.prompt_ids + seg.completion_ids and set(row[n:].tolist()) <= {pad}
        assert m[len(seg.prompt_ids): n].tolist() == seg.loss_mask and m.sum() == sum(seg.loss_mask)
    with pytest.raises(ValueError, match="does not fit"):
        demo_rows(segments, 64, pad)


def test_demo_segments_keep_every_decision_and_as_many_copies():
    segments = demo_segments(CFG, WINDOW, 4, seed=0, harness=harness_for(WINDOW, "summarize"))
    assert all(segment_text(s).startswith("next_file() submit(code: string)\n") for s in segments)
    decisions = sum(informative(s) for s in segments)
    assert decisions >= 4 * 2  # two steps and a submit per episode (steps may share a segment)
    firsts = sum(SUMMARY_OPEN not in ByteTokenizer().decode(s.prompt_ids) for s in segments)
    assert firsts == 4 and len(segments) <= 2 * (decisions + firsts)


def test_segment_text_round_trips_the_tokens(clean_episodes):
    _, results = clean_episodes
    tok = ByteTokenizer()
    seg = results[0].segments[3]
    assert tok.encode(segment_text(seg), add_bos=True) == seg.prompt_ids + seg.completion_ids


def test_masked_pretrain_step_counts_only_the_marked_targets():
    import torch
    import torch.nn.functional as F

    from tidal.model import build_model
    from tidal.model.presets import preset
    from tidal.pretrain.config import PretrainConfig
    from tidal.pretrain.loop import make_optimizer, train_step

    model = build_model(preset("tiny"), seed=0)
    batch = torch.randint(0, 256, (2, 12))
    mask = torch.zeros(2, 12)
    mask[0, 5:8] = 1.0
    with torch.no_grad():
        logits = model(batch[:, :-1])
    expected = F.cross_entropy(logits[0, 4:7], batch[0, 5:8]).item()
    loss = train_step(model, make_optimizer(model, PretrainConfig()), batch, 0.0, 1.0, "float32", mask)
    assert abs(loss - expected) < 1e-5


def test_the_environment_corpus_is_demonstrations_rendered_as_the_harness_shows_them():
    from tidal.families.ledger import load_environment

    spec = load_environment(None, LedgerConfig(num_files=12))
    docs = spec.build_corpus(10, 3)
    assert len(docs) == 10 and docs == spec.build_corpus(10, 3)
    assert all(d.startswith("next_file() submit(code: string)\nWrite f:") for d in docs)
    assert sum('<call>{"submit"' in d for d in docs) >= 1 and all("\n<obs>" in d for d in docs)
    assert all(len(ByteTokenizer().encode(d)) < CFG.corpus_window for d in docs)
