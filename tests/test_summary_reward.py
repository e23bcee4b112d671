"""The dense summary reward: the ledger family's check of a summary, the harness attaching it to
the segment the summary closes, and the trainer's per-row advantage (harness.summary_reward)."""

import dataclasses

import pytest
import torch

from tidal.env import OBS_CLOSE, OBS_OPEN
from tidal.families.ledger.config import LedgerConfig
from tidal.families.ledger.demos import harness_for, play_expert
from tidal.families.ledger.environment import LedgerEnvironment
from tidal.families.ledger.tasks import sample_tasks, summary_score
from tidal.harness import SUMMARY_CLOSE, SUMMARY_OPEN
from tidal.trainer.grpo import collate, group_advantages
from tidal.trajectory import Segment, Trajectory

FACTS = [("mul", 5), ("add", 7)]


# ------------------------------------------------------------------ the check


@pytest.mark.parametrize("summary, facts, score", [
    ("x*=5;x+=7", FACTS, 1.0),                 # right
    ("x*=5; x+=7", FACTS, 1.0),                # spaces do not matter
    ("x*=4;x+=8", FACTS, 0.0),                 # both garbled
    ("x*=5", FACTS, 0.5),                      # one dropped
    ("x*=5;x+=8", FACTS, 0.5),                 # one garbled
    ("x+=7;x*=5", FACTS, 0.5),                 # swapped: only one in order
    ("x*=5;x+=7;x-=2", FACTS, 2 / 3),          # one added
    ("x*=5;blah", FACTS, 0.5),                 # a statement not in the family's form
    ("none", FACTS, 0.0),                      # forgot everything
    ("none", [], 1.0),                         # nothing to carry yet
    ("", [], 1.0),
    ("x*=5", [], 0.0),                         # a fact made up
])
def test_summary_score_right_wrong_and_partly_right(summary, facts, score):
    assert summary_score(summary, facts) == pytest.approx(score)


def context(carried: str | None, files: list[str]) -> str:
    head = "next_file() submit(code)\nWrite f: all '# f:' steps.\n"
    block = "" if carried is None else f"{SUMMARY_OPEN}{carried}{SUMMARY_CLOSE}\n"
    turns = "".join(f'<call>next_file</call>{OBS_OPEN}{f}{OBS_CLOSE}' for f in files)
    return head + block + turns


def test_the_ledger_check_compares_with_what_the_context_showed():
    env = LedgerEnvironment(None, None)
    files = ["m_aa.py\nLIMIT_AA = rate\n", "m_ab.py\n# f: x+=7\ndef shift_ab(v):\n    return v + top\n"]
    shown = context("x*=5", files)
    assert env.check_summary(shown, "x*=5;x+=7") == 1.0
    assert env.check_summary(shown, "x*=5") == 0.5                     # the new step not added
    assert env.check_summary(context(None, files), "x+=7") == 1.0      # first context
    # a faithful copy of a wrong carried summary is not charged again
    assert env.check_summary(context("x*=4", files), "x*=4;x+=7") == 1.0


def test_environments_without_a_check_return_none():
    from tidal.env.base import Environment

    assert Environment.check_summary(None, "ctx", "summary") is None


# ------------------------------------------------------------------ the harness


@pytest.fixture(scope="module")
def ledger_tasks():
    return sample_tasks(LedgerConfig(num_files=12), 3, 0, False)


def play(tasks, slip_rate: float, **harness):
    cfg = harness_for(272, "summarize").model_copy(update=harness)
    return play_expert(tasks, 272, slip_rate, 0, cfg)


def test_a_ledger_episode_attaches_each_summary_check_to_its_segment(ledger_tasks):
    results = play(ledger_tasks, 0.0, summary_reward="check", summary_reward_coef=2.0)
    for r in results:
        assert len(r.segments) >= 3
        *summarized, last = r.segments
        assert [s.reward for s in summarized] == [2.0] * len(summarized)  # the expert is right
        assert last.reward is None                                       # it ends in a submit
        assert r.summary_scores == [1.0] * len(summarized)


def test_a_slipping_expert_gets_a_lower_score_where_it_slipped(ledger_tasks):
    results = play(ledger_tasks, 0.5, summary_reward="check")
    scores = [s for r in results for s in r.summary_scores]
    assert min(scores) < 1.0 and max(scores) == 1.0


def test_summary_reward_off_attaches_nothing(ledger_tasks):
    results = play(ledger_tasks, 0.0)
    assert all(s.reward is None for r in results for s in r.segments)
    assert all(r.summary_scores == [] for r in results)


# ------------------------------------------------------------------ the per-row advantage


def seg(n: int = 3, reward: float | None = None) -> Segment:
    return Segment([1], list(range(2, 2 + n)), [-0.5] * n, [0] * n, [1] * n, reward=reward)


def traj(group: int, reward: float, dense: list[float | None]) -> Trajectory:
    return Trajectory(task_id=f"t{group}", group_id=group, reward=reward,
                      segments=[seg(reward=d) for d in dense])


def test_the_row_advantage_adds_the_dense_reward_centred_per_group_and_index():
    trajs = [traj(0, 1.0, [1.0, 1.0, None]),     # right summaries, solved
             traj(0, 0.0, [1.0, 0.5, None]),     # slipped at its second summary
             traj(1, 0.5, [0.25, None])]         # alone at its index: centred to 0
    tb = collate(trajs, pad_id=0, normalize_std=False)
    # episode advantages: group 0 rewards 1, 0 -> +0.5, -0.5; group 1 alone -> 0.
    # index 0 in group 0: both 1.0 -> +0; index 1: mean 0.75 -> +0.25, -0.25.
    expected = [0.5, 0.5 + 0.25, 0.5, -0.5, -0.5 - 0.25, -0.5, 0.0, 0.0]
    assert tb.advantages.tolist() == pytest.approx(expected)
    assert tb.row_traj.tolist() == [0, 0, 0, 1, 1, 1, 2, 2]


def test_short_segments_skipped_by_collate_keep_their_index():
    short = Segment([], [9], [0.0], [-1], [0], reward=0.0)  # one token: nothing to predict
    trajs = [Trajectory("a", 0, [short, seg(reward=1.0)], reward=1.0),
             Trajectory("a", 0, [seg(reward=0.0), seg(reward=0.0)], reward=1.0)]
    tb = collate(trajs, pad_id=0)
    # rows: a's index 1 (1.0 vs 0.0 at index 1 -> +0.5), b's index 0 (alone -> 0), b's index 1
    assert tb.advantages.tolist() == pytest.approx([0.5, 0.0, -0.5])


def test_without_segment_rewards_collate_gives_exactly_todays_batch():
    plain = [traj(0, 1.0, [None, None]), traj(0, 0.0, [None, None, None]), traj(1, 0.3, [None])]
    todays = collate(plain, pad_id=0, segment_rewards=False)
    for got in (collate(plain, pad_id=0),
                collate([dataclasses.replace(t, segments=[dataclasses.replace(s, reward=0.7)
                                                          for s in t.segments]) for t in plain],
                        pad_id=0, segment_rewards=False)):
        for name, t in vars(todays).items():
            other = getattr(got, name)
            assert (t is None and other is None) or torch.equal(t, other), name
    adv = group_advantages([1.0, 0.0, 0.3], [0, 0, 1], True)
    assert torch.equal(todays.advantages, adv[todays.row_traj])
