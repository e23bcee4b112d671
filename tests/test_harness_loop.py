"""The multi-turn harness on a scripted model: loss masks, budgets, bad calls, concurrency,
self-summarization and the sliding window, timeouts and failures."""

import asyncio
from dataclasses import dataclass

import pytest

from harness_fakes import ScriptedEngine
from tidal.env import OBS_CLOSE, OBS_OPEN, EnvironmentSpec, Rubric, StepResult, ToolEnvironment, format_call
from tidal.errors import UserError
from tidal.harness import SUMMARY_CLOSE, SUMMARY_OPEN, HarnessConfig, run_episodes
from tidal.model.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


@dataclass(frozen=True)
class NoteTask:
    task_id: str
    prompt: str
    secret: str


class Notes(ToolEnvironment):
    system_prompt = "Notes."
    tool_style = "signature"

    def __init__(self, rubric):
        super().__init__(rubric)
        self.count = 0
        self.answer = None

    async def setup(self, task):
        return task.prompt

    def tools(self):
        return [self.note, self.submit]

    def note(self, text: str) -> str:
        """Write a note."""
        self.count += 1
        return f"noted {self.count}"

    def submit(self, answer: str) -> str:
        """Answer."""
        self.answer = answer
        self.finish()
        return "ok"


def correct(task, env) -> float:
    return 1.0 if env.answer == task.secret else 0.0


def notes_spec(env_cls=Notes) -> EnvironmentSpec:
    rubric = Rubric([(correct, 1.0)])
    return EnvironmentSpec("notes", lambda: env_cls(rubric), lambda n, seed, heldout: tasks(n))


def tasks(n):
    return [NoteTask(f"t{i}", f"Remember {i}.", str(i)) for i in range(n)]


def run(policy, n=1, max_seq_len=512, spec=None, **cfg):
    engine = ScriptedEngine(policy, max_seq_len=max_seq_len)
    trajs, stats = run_episodes(engine, spec or notes_spec(), tasks(n), HarnessConfig(**cfg))
    return engine, trajs


def text_of(ids):
    return TOK.decode(ids)


def n_obs(prompt: str) -> int:
    return prompt.count(OBS_OPEN)


def answer_after(k):
    """Take k notes, then submit the task's number."""
    def policy(prompt):
        if n_obs(prompt) < k:
            return "hm " + format_call("note", {"text": "x"})
        secret = prompt.split("Remember ")[1].split(".")[0]
        return format_call("submit", {"answer": secret})
    return policy


def test_environment_tokens_are_masked_and_model_tokens_keep_logprob_and_version():
    engine, (t,) = run(answer_after(2))
    assert t.reward == 1.0 and t.reason == "done" and t.episode.turns == 3
    (seg,) = t.segments
    model = [i for i, m in zip(seg.completion_ids, seg.loss_mask) if m]
    env = [i for i, m in zip(seg.completion_ids, seg.loss_mask) if not m]
    turns = [text_of(r) for r in [engine.requests[0].prompt_ids]]  # the head
    assert text_of(seg.prompt_ids) == turns[0] and seg.prompt_ids[0] == TOK.bos_id
    assert text_of(model) == ("hm " + format_call("note", {"text": "x"})) * 2 + format_call("submit", {"answer": "0"})
    assert text_of(env) == f"{OBS_OPEN}noted 1{OBS_CLOSE}{OBS_OPEN}noted 2{OBS_CLOSE}"
    for lp, v, m in zip(seg.logprobs, seg.versions, seg.loss_mask):
        assert (lp, v) == ((-0.5, 0) if m else (0.0, -1))
    assert t.episode.model_tokens == len(model) and t.episode.env_tokens == len(env)


def test_each_turn_sees_the_whole_context_so_far():
    engine, (t,) = run(answer_after(2))
    seg = t.segments[0]
    full = seg.prompt_ids + seg.completion_ids
    for r in engine.requests:
        assert full[: len(r.prompt_ids)] == r.prompt_ids


def test_turn_budget_ends_an_episode_of_bad_calls():
    engine, (t,) = run(lambda p: "no call here", max_turns=5, max_seq_len=2048)
    assert t.reason == "turn_budget" and t.reward == 0.0
    assert t.episode.turns == 5 and t.episode.tool_errors == 5 and len(engine.requests) == 5
    assert text_of(t.segments[0].completion_ids).count("error (no_call)") == 5


def test_token_budget_caps_model_tokens_and_bad_calls_pay_for_their_length():
    long_garbage = "<call>{" + "z" * 200
    engine, (t,) = run(lambda p: long_garbage, max_tokens=150, max_turn_tokens=60)
    assert t.reason == "token_budget" and t.episode.model_tokens == 150
    assert [r.max_new_tokens for r in engine.requests] == [60, 60, 30]
    assert t.episode.tool_errors == 3


@pytest.mark.parametrize("action", ['<call>{"note": {"text": 5}}</call>', '<call>{"rm": {}}</call>',
                                    "<call>{nope</call>", '<call>{"note": {"text": "' + "a" * 5000 + '"}}</call>'])
def test_malformed_calls_never_end_the_episode_for_free(action):
    engine, (t,) = run(lambda p: action if n_obs(p) == 0 else answer_after(0)(p),
                       max_turn_tokens=400, max_seq_len=2048)
    assert t.episode.tool_errors == 1 and t.episode.turns == 2 and t.reward == 1.0
    assert "error (" in text_of(t.segments[0].completion_ids)


def test_episodes_run_concurrently_and_their_turns_share_engine_steps():
    engine, trajs = run(answer_after(3), n=6)
    assert [t.reward for t in trajs] == [1.0] * 6 and [t.task_id for t in trajs] == [f"t{i}" for i in range(6)]
    assert engine.max_batch == 6  # every turn of the six episodes decoded in the same steps


def test_several_samples_per_task_form_groups():
    engine = ScriptedEngine(answer_after(0))
    trajs, _ = run_episodes(engine, notes_spec(), tasks(2), HarnessConfig(), samples_per_task=3,
                            group_ids=[7, 9])
    assert [t.group_id for t in trajs] == [7, 7, 7, 9, 9, 9]
    assert sorted(r.tag[0] for r in engine.requests) == list(range(6))


def summarizing(secret_note="KEEP", turns_before_submit=40):
    """Writes long notes; summarises by repeating what it must keep; submits after
    ``turns_before_submit`` notes (counted per task)."""
    turns = {}

    def policy(prompt):
        if prompt.endswith(SUMMARY_OPEN):
            return f"facts: {secret_note} noted so far{SUMMARY_CLOSE} trailing"
        task = prompt.split("Remember ")[1].split(".")[0]
        turns[task] = turns.get(task, 0) + 1
        if turns[task] > turns_before_submit:
            return format_call("submit", {"answer": "0"})
        return "thinking " * 2 + format_call("note", {"text": "y" * 30})
    return policy


def test_self_summarization_chains_segments_from_head_and_summary():
    window = 400
    engine, (t,) = run(summarizing(turns_before_submit=12), max_seq_len=window,
                       context_mode="summarize", summary_trigger=0.7, summary_max_tokens=40,
                       max_turns=100)
    segs = t.segments
    assert t.episode.resets == len(segs) - 1 >= 2 and t.reward == 1.0
    head = segs[0].prompt_ids
    for prev, seg in zip(segs, segs[1:]):
        summary = text_of([i for i, m in zip(prev.completion_ids, prev.loss_mask) if m]).split("note\":{\"text\":\"" + "y" * 30 + "\"}}</call>")[-1]
        assert summary == f"facts: KEEP noted so far{SUMMARY_CLOSE}"  # trained in the closing segment
        assert text_of(prev.completion_ids).endswith(SUMMARY_OPEN + summary)
        assert seg.prompt_ids == head + TOK.encode(SUMMARY_OPEN + summary + "\n")
    for seg in segs:
        assert len(seg.prompt_ids) + len(seg.completion_ids) <= window
    for r in engine.requests:
        assert len(r.prompt_ids) + r.max_new_tokens <= window
    kinds = [r.tag[1] for r in engine.requests]
    assert kinds.count("summary") == t.episode.summary_count == t.episode.resets
    assert t.episode.summary_tokens_mean == len(TOK.encode(f"facts: KEEP noted so far{SUMMARY_CLOSE}"))
    assert t.episode.effective_horizon > 1.5


def test_summary_is_triggered_by_the_trigger_fraction():
    common = dict(max_seq_len=1000, context_mode="summarize", summary_max_tokens=40, max_turns=8)
    _, (late,) = run(summarizing(turns_before_submit=7), summary_trigger=1.0, **common)
    _, (early,) = run(summarizing(turns_before_submit=7), summary_trigger=0.4, **common)
    assert late.episode.resets == 0 and early.episode.resets >= 1
    first = early.segments[0]
    assert len(first.prompt_ids) + len(first.completion_ids) >= 0.4 * 1000 - 200


def test_a_summary_without_its_closing_tag_is_closed_by_the_harness_within_its_bound():
    def policy(prompt):
        if prompt.endswith(SUMMARY_OPEN):
            return "s" * 100
        return summarizing(turns_before_submit=8)(prompt)

    _, (t,) = run(policy, max_seq_len=400, context_mode="summarize", summary_max_tokens=20, max_turns=30)
    assert t.episode.summary_tokens_max == 20
    assert text_of(t.segments[1].prompt_ids).endswith(SUMMARY_OPEN + "s" * 20 + SUMMARY_CLOSE + "\n")


def test_truncation_keeps_the_head_and_the_newest_whole_turns():
    window = 400
    _, (t,) = run(summarizing(turns_before_submit=12), max_seq_len=window, context_mode="truncate",
                  truncate_keep=0.6, max_turns=100)
    segs = t.segments
    assert len(segs) >= 3 and t.episode.summary_count == 0 and t.reward == 1.0
    head = segs[0].prompt_ids
    turn_start = TOK.encode("thinking ")
    for prev, seg in zip(segs, segs[1:]):
        assert seg.prompt_ids[: len(head)] == head and len(seg.prompt_ids) <= 0.6 * window
        tail = seg.prompt_ids[len(head):]
        assert tail[: len(turn_start)] == turn_start  # cut at a turn boundary
        assert prev.completion_ids[-len(tail):] == tail
        assert set(seg.loss_mask[: 1]) == {1}  # the new window starts with a model turn
    for seg in segs:
        assert len(seg.prompt_ids) + len(seg.completion_ids) <= window


def test_stop_mode_ends_the_episode_when_the_window_is_full():
    _, (t,) = run(summarizing(), max_seq_len=400, context_mode="stop", max_turns=100)
    assert t.reason == "context" and len(t.segments) == 1 and t.episode.effective_horizon <= 1.0


def test_an_observation_that_does_not_fit_is_shown_after_the_summary():
    class Loud(Notes):
        def note(self, text: str) -> str:
            """Write a note."""
            return "L" * 150

    turns = []
    turn = "t" * 40 + format_call("note", {"text": "q"})

    def policy(prompt):
        if prompt.endswith(SUMMARY_OPEN):
            return f"ok{SUMMARY_CLOSE}"
        turns.append(prompt)
        return format_call("submit", {"answer": "0"}) if len(turns) > 5 else turn

    # window 350: after the head and a turn the 163-token observation has no room (< 350 - 41
    # summary reserve - 169); after [head, summary] it has.
    _, (t,) = run(policy, max_seq_len=350, spec=notes_spec(Loud), context_mode="summarize",
                  summary_trigger=1.0, summary_max_tokens=20, max_observation_tokens=200,
                  max_turn_tokens=80, max_turns=40)
    assert t.reward == 1.0 and t.episode.resets >= 1
    first, second = t.segments[:2]
    assert text_of(first.completion_ids) == turn + SUMMARY_OPEN + "ok" + SUMMARY_CLOSE
    assert text_of(second.completion_ids).startswith(OBS_OPEN + "L" * 150 + OBS_CLOSE)


def test_long_observations_are_cut_to_their_token_limit():
    class Flood(Notes):
        def note(self, text: str) -> str:
            """Write a note."""
            return "F" * 1000

    _, (t,) = run(answer_after(1), spec=notes_spec(Flood), max_observation_tokens=50)
    env_text = text_of([i for i, m in zip(t.segments[0].completion_ids, t.segments[0].loss_mask) if not m])
    assert env_text == OBS_OPEN + "F" * 42 + "...[cut]" + OBS_CLOSE


def test_a_hung_environment_step_ends_the_episode_instead_of_hanging():
    class Hang(Notes):
        async def step(self, action):
            await asyncio.sleep(30)

    _, (t,) = run(answer_after(0), spec=notes_spec(Hang), step_timeout_s=0.2)
    assert t.reason == "step_timeout" and t.reward == 0.0


def test_end_gives_partial_credit_when_the_budget_runs_out():
    class Partial(Notes):
        async def end(self, reason):
            return StepResult("", 0.25 * self.count, True, {"reason": reason})

    _, (t,) = run(lambda p: format_call("note", {"text": "n"}), spec=notes_spec(Partial), max_turns=3)
    assert t.reason == "turn_budget" and t.reward == pytest.approx(0.75)


def test_an_engine_failure_raises_instead_of_hanging():
    def broken(prompt):
        raise RuntimeError("decode failed")

    with pytest.raises(RuntimeError, match="decode failed"):
        run(broken, n=3)


def test_a_task_whose_prompt_does_not_fit_is_skipped_counted_and_never_trained():
    from tidal.orchestrator.evaluate import heldout_pass1
    from tidal.orchestrator.planning import staleness_gate
    from tidal.orchestrator.records import RunState
    from tidal.orchestrator.run_output import rollout_metrics

    engine = ScriptedEngine(answer_after(0), max_seq_len=256, max_new_tokens=64)
    long, short = NoteTask("long", "x" * 200, "0"), NoteTask("short", "Remember 1.", "1")
    trajs, _ = run_episodes(engine, notes_spec(), [long, short], HarnessConfig(), samples_per_task=2)
    skipped, done = trajs[:2], trajs[2:]
    for t in skipped:
        assert (t.reason, t.segments, t.reward, t.solved) == ("prompt_too_long", [], 0.0, False)
    assert all(t.solved for t in done) and len(engine.requests) == 2  # the long one never ran
    metrics = rollout_metrics(trajs)
    assert metrics.reasons == {"prompt_too_long": 2, "done": 2} and metrics.pass_rate == 0.5
    state = RunState()
    kept, _ = staleness_gate(trajs, trainer_version=0, max_staleness=0, state=state)
    assert len(kept) == 4 and state.dropped_stale == 0  # nothing generated, so nothing stale
    result = heldout_pass1(engine, notes_spec(), [long, short], HarnessConfig(), samples_per_task=1)
    assert result["pass1"] == 0.5 and result["reasons"] == {"prompt_too_long": 1, "done": 1}


def test_success_is_the_environments_rule_not_reward_at_least_one():
    from tidal.orchestrator.evaluate import heldout_pass1
    from tidal.orchestrator.run_output import rollout_metrics

    def bonus(task, env) -> float:
        return 1.0

    def solved(reward, info):  # the answer must be right; the bonus alone never solves it
        return info["reward/correct"] == 1.0

    rubric = Rubric([(correct, 0.5), (bonus, 1.0)])
    spec = EnvironmentSpec("strict", lambda: Notes(rubric), lambda n, s, h: tasks(n), success=solved)
    wrong = lambda prompt: format_call("submit", {"answer": "nope"})  # noqa: E731
    for policy, reward, ok in ((answer_after(0), 1.5, True), (wrong, 1.0, False)):
        trajs, _ = run_episodes(ScriptedEngine(policy), spec, tasks(2), HarnessConfig())
        assert [(t.reward, t.solved) for t in trajs] == [(reward, ok)] * 2
        assert rollout_metrics(trajs).pass_rate == float(ok)
        assert heldout_pass1(ScriptedEngine(policy), spec, tasks(2), HarnessConfig(), 1)["pass1"] == float(ok)
    half = Rubric([(correct, 0.5)])  # reward 0.5 < 1, yet solved by the rule
    spec = EnvironmentSpec("half", lambda: Notes(half), lambda n, s, h: tasks(n), success=solved)
    trajs, _ = run_episodes(ScriptedEngine(answer_after(0)), spec, tasks(1), HarnessConfig())
    assert trajs[0].reward == 0.5 and trajs[0].solved


def test_context_window_may_not_exceed_the_engine():
    engine = ScriptedEngine(answer_after(0), max_seq_len=256)
    with pytest.raises(UserError, match="max_seq_len"):
        run_episodes(engine, notes_spec(), tasks(1), HarnessConfig(context_window=512))


def test_episode_metrics_reach_the_step_record():
    from tidal.orchestrator.run_output import rollout_metrics

    _, trajs = run(summarizing(turns_before_submit=12), n=2, max_seq_len=400,
                   context_mode="summarize", summary_max_tokens=40, max_turns=100)
    m = rollout_metrics(trajs).to_json()
    assert m["episode/resets"] == sum(t.episode.resets for t in trajs) / 2 > 0
    assert m["episode/effective_horizon"] > 1 and m["episode/turns"] == 13


def test_a_tool_stuck_forever_is_abandoned_and_the_rollout_still_returns():
    import threading

    release = threading.Event()

    class Stuck(Notes):
        tool_timeout_s = 0.2

        def note(self, text: str) -> str:
            """Write a note."""
            release.wait()  # blocks its thread until the test ends
            return "never seen"

    out = {}
    worker = threading.Thread(target=lambda: out.update(t=run(answer_after(1), spec=notes_spec(Stuck))[1][0]))
    worker.start()
    worker.join(timeout=60)
    finished = not worker.is_alive()
    release.set()
    assert finished, "run_episodes waited for an abandoned tool thread"
    t = out["t"]
    assert t.reward == 1.0 and t.episode.tool_errors == 1
    assert "error (timeout)" in text_of(t.segments[0].completion_ids)
