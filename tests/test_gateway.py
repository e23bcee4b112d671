"""The rollout gateway (tidal.gateway): an outside harness, written with the openai client and
run as its own process, is served by the rollout's engine; its trajectory is built from the ids
the engine sampled and the chat template's ids for what the harness added (never re-tokenised),
its answer graded by the task family, and a harness that crashes, hangs or floods ends only its
own episode, with the reason recorded."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from tidal.engine.request import GenerationResult
from tidal.env.registry import load_environment
from tidal.harness.history import History
from tidal.chat.render import Renderer
from tidal.harness import HarnessConfig, run_episodes
from tidal.model.tokenizer import HFTokenizer

from chat_tokenizer import chatml_config, tiny_tokenizer

HARNESS = Path(__file__).parent / "data" / "harness_scripted.py"
AGENT = Path(__file__).parent.parent / "examples" / "harness_agent.py"
QWEN_TEMPLATE = (Path(__file__).parent / "data" / "qwen2_5_chat_template.jinja").read_text()
ANSWER = "```python\ndef f(x):\n    return x + 3\n```"


@pytest.fixture
def tok(tmp_path) -> HFTokenizer:
    return HFTokenizer(tiny_tokenizer(tmp_path / "tok", chatml_config()))


def _non_canonical(tok, text: str) -> list[int]:
    """One id per character: ids a model may sample that BPE would merge when re-encoding."""
    ids = [i for ch in text for i in tok.encode(ch)]
    assert ids != tok.encode(text)
    return ids


class Sampler:
    """A policy that 'samples' the answer, one id per character, then the end of turn."""

    def __init__(self, tok, text: str = ANSWER):
        self.ids = _non_canonical(tok, text) + [tok.end_of_turn_id]
        self.requests = []

    async def generate(self, request) -> GenerationResult:
        self.requests.append(request)
        ids = self.ids[: request.max_new_tokens]
        finish = "eos" if ids[-1] == self.ids[-1] else "length"
        return GenerationResult(len(self.requests), list(request.prompt_ids), ids,
                                [-0.5] * len(ids), [7] * len(ids), None, finish, "", request.tag)


def _engine(tok, max_seq_len: int = 1024):
    return SimpleNamespace(tokenizer=tok, is_moe=False, cfg=SimpleNamespace(
        max_seq_len=max_seq_len, max_new_tokens=64))


def _spec(sandbox, mode: str, **args):
    return load_environment("harness", sandbox=sandbox, command=f"{{python}} {HARNESS} {mode}",
                            tasks="funcs", task_args={"prompt_style": "instruct"}, **args)


def _run(tok, mode: str, samples: int = 2, client=None, **args):
    from tidal.sandbox import Sandbox
    from tidal.config import load_config

    with Sandbox(load_config(None, []).env.sandbox) as sandbox:
        spec = _spec(sandbox, mode, **args)
        client = client or Sampler(tok)
        tasks = spec.sample_tasks(1, 0, False)
        trajs, _ = run_episodes(_engine(tok), spec, tasks, HarnessConfig(), samples_per_task=samples,
                                client=client, seed=0)
    return trajs, client


# ------------------------------------------------------------------ history (no process)


def _history(tok) -> History:
    r = Renderer(tok)
    return History(r.render, r.encode, r.ends_turn, r.end_of_turn_text)


def _result(ids):
    return GenerationResult(0, [], ids, [-1.0] * len(ids), [3] * len(ids), None, "eos", "", None)


def test_a_harness_that_sends_back_what_it_got_extends_one_segment_with_the_sampled_ids(tok):
    history = _history(tok)
    first = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}]
    place = history.place(first, None)
    assert place.prompt_ids == tok.encode_chat(first) and not place.matched
    sampled = _non_canonical(tok, "Let me compute it. 4") + [tok.end_of_turn_id]
    reply = {"role": "assistant", "content": tok.decode(sampled)}
    history.record(place, first, None, _result(sampled), reply)
    second = first + [reply, {"role": "user", "content": "You are terse?"}]
    place2 = history.place(second, None)
    assert place2.matched and place2.segment == 0
    assert place2.prompt_ids[: len(place.prompt_ids) + len(sampled)] == place.prompt_ids + sampled
    # the template's own ids for what the harness added: its rendering after the reply
    through = tok.render_chat(second[:3], add_generation_prompt=False)
    assert place2.tail == tok.encode(through[len(tok.render_chat(first)) + len(reply["content"]) + len("<|im_end|>"):]
                                     + tok.render_chat(second)[len(through):])
    history.record(place2, second, None, _result([5, tok.end_of_turn_id]), {"role": "assistant", "content": tok.decode([5])})
    seg = history.segments[0].to_segment()
    assert len(history.segments) == 1 and history.matched == 1 and history.new_segments == 1
    assert seg.completion_ids[: len(sampled)] == sampled
    assert seg.loss_mask == [1] * len(sampled) + [0] * len(place2.tail) + [1, 1]
    # decoding the whole segment gives the conversation as the template renders it
    assert tok.decode(seg.prompt_ids + seg.completion_ids) == tok.decode(tok.encode_chat(
        second + [{"role": "assistant", "content": tok.decode([5])}], add_generation_prompt=False)).rstrip("\n")


def test_edited_history_opens_a_new_segment(tok):
    history = _history(tok)
    first = [{"role": "user", "content": "What is 2+2?"}]
    place = history.place(first, None)
    history.record(place, first, None, _result([5, 6, tok.end_of_turn_id]), {"role": "assistant", "content": "x"})
    edited = first + [{"role": "assistant", "content": "y"}, {"role": "user", "content": "and?"}]
    place2 = history.place(edited, None)
    assert not place2.matched and place2.segment == 1 and place2.prompt_ids == tok.encode_chat(edited)


def test_a_reply_cut_by_its_token_limit_is_closed_by_the_template(tok):
    history = _history(tok)
    first = [{"role": "user", "content": "What is 2+2?"}]
    place = history.place(first, None)
    history.record(place, first, None, _result([5, 6]), {"role": "assistant", "content": tok.decode([5, 6])})
    second = first + [{"role": "assistant", "content": tok.decode([5, 6])}, {"role": "user", "content": "go on"}]
    place2 = history.place(second, None)
    assert place2.matched and place2.tail[0] == tok.end_of_turn_id


def test_tool_call_arguments_compare_as_values_not_as_text():
    from tidal.chat.tool_calls import template_messages

    a = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1, "b": 2}'}}]}
    b = {"role": "assistant", "content": "", "refusal": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"b":2,"a":1}'}}]}
    assert template_messages([a]) == template_messages([b])


# ------------------------------------------------------------------ whole episodes


@pytest.mark.parametrize("preload", [[], ["openai"]])
def test_harness_episodes_are_graded_and_keep_the_sampled_ids(tok, preload):
    """Started afresh, or forked from the fork server that imported openai once."""
    trajs, client = _run(tok, "answer", preload=preload)
    assert len(trajs) == 2 and len(client.requests) == 4
    for t in trajs:
        assert t.reason == "wrong_answer" and t.info["total"] > 0  # graded by funcs' grader
        assert t.info["gateway_turns"] == 2 and t.info["gateway_history_matched"] == 1
        assert len(t.segments) == 1
        seg = t.segments[0]
        model = [i for i, m in zip(seg.completion_ids, seg.loss_mask) if m]
        assert model == client.ids * 2  # both turns, exactly as sampled
    assert trajs[0].segments[0].prompt_ids == trajs[1].segments[0].prompt_ids
    assert all(r.temperature is None for r in client.requests)  # the run's own temperature


def test_an_answer_left_in_the_workspace_is_graded_too(tok):
    trajs, _ = _run(tok, "file", samples=1)
    assert trajs[0].reason not in ("no_answer", "crashed"), trajs[0].reason


def test_the_harness_may_post_its_own_reward_streaming(tok):
    trajs, client = _run(tok, "reward", samples=1, reward="harness")
    assert trajs[0].reward == 0.25 and trajs[0].reason.startswith("scored ")


def test_edited_history_is_counted_and_trained_as_two_segments(tok):
    trajs, client = _run(tok, "edit", samples=1)
    t = trajs[0]
    assert t.info["gateway_history_matched"] == 0 and t.info["gateway_new_segments"] == 2
    assert len(t.segments) == 2


@pytest.mark.parametrize("preload", [[], ["openai"]])
@pytest.mark.parametrize("mode,reason", [("crash", "crashed"), ("hang", "timeout"),
                                         ("flood", "turn_budget")])
def test_a_misbehaving_harness_ends_its_own_episode_with_a_reason(tok, mode, reason, preload):
    # a hang ends on the timeout, so it is short; the others end on their own, and a loaded
    # machine may take seconds to start a harness that imports openai
    timeout_s = 3.0 if mode == "hang" else 60.0
    trajs, _ = _run(tok, mode, samples=1, timeout_s=timeout_s, max_turns=3, preload=preload)
    assert trajs[0].reason == reason and trajs[0].reward == 0.0


def test_a_key_works_only_while_its_episode_runs(tok):
    from tidal.gateway.config import GatewayConfig
    from tidal.gateway.server import Gateway

    async def main():
        cfg = GatewayConfig(command="true")
        async with Gateway(Sampler(tok), tok, _engine(tok).cfg, cfg, 1024) as gateway:
            channel = gateway.open(0, None)
            ok = await asyncio.to_thread(_get, gateway.base_url + "/models", channel.key)
            wrong = await asyncio.to_thread(_get, gateway.base_url + "/models", "not-a-key")
            gateway.close(channel)
            expired = await asyncio.to_thread(_get, gateway.base_url + "/models", channel.key)
        return ok, wrong, expired

    assert asyncio.run(main()) == (200, 401, 401)


def _get(url: str, key: str) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    try:
        return urllib.request.urlopen(request).status
    except urllib.error.HTTPError as e:
        json.loads(e.read())  # an OpenAI-shaped error body
        return e.code


# ------------------------------------------------------------------ the example harness, tools


class ToolSampler:
    """A policy that 'samples' the example agent's two turns: run_python on a snippet, then
    submit a solution, each ending with the template's end of a reply."""

    def __init__(self, tok, end: list[int]):
        code = json.dumps({"code": "def f(x):\n    return x\n"})
        self.turns = [f'<tool_call>\n{{"name": "run_python", "arguments": {{"code": "print(6 * 7)"}}}}\n</tool_call>',
                      f'<tool_call>\n{{"name": "submit", "arguments": {code}}}\n</tool_call>']
        self.tok, self.end, self.requests = tok, end, []

    async def generate(self, request) -> GenerationResult:
        self.requests.append(request)
        ids = self.tok.encode(self.turns[len(self.requests) - 1]) + self.end
        return GenerationResult(len(self.requests), list(request.prompt_ids), ids,
                                [-0.5] * len(ids), [7] * len(ids), None, "eos", "", request.tag)


def _tool_model(model: str, tmp_path):
    """(tokenizer, the ids that end a reply): the byte model's plain template, or a BPE
    tokenizer with a real tool-calling template (Qwen2.5's)."""
    from tidal.model.tokenizer import ByteTokenizer
    from tidal.chat.template import END_OF_TURN

    if model == "byte":
        tok = ByteTokenizer()
        return tok, tok.encode(END_OF_TURN)
    tok = HFTokenizer(tiny_tokenizer(tmp_path / "tok", chatml_config(chat_template=QWEN_TEMPLATE)))
    return tok, [tok.end_of_turn_id]


@pytest.mark.parametrize("model", ["byte", "qwen-template"])
def test_the_example_agent_calls_tools_over_the_gateway(tmp_path, model):
    """examples/harness_agent.py, unchanged: its run_python call runs, the tool result goes back
    as a tool message rendered by the template, its submit is graded; both turns extend one
    segment (the template's tool frame between them), on the byte model's plain template and on
    a real tool-calling template (Qwen2.5's)."""
    from tidal.config import load_config
    from tidal.sandbox import Sandbox

    tok, end = _tool_model(model, tmp_path)
    client = ToolSampler(tok, end)
    with Sandbox(load_config(None, []).env.sandbox) as sandbox:
        spec = load_environment("harness", sandbox=sandbox, command=f"{{python}} {AGENT}",
                                task_args={"prompt_style": "instruct"}, preload=["openai"])
        [traj], _ = run_episodes(_engine(tok, 4096), spec, spec.sample_tasks(1, 0, False),
                                 HarnessConfig(), client=client, seed=0)
    assert traj.info["gateway_turns"] == 2 and traj.info["gateway_history_matched"] == 1
    assert traj.reason == "wrong_answer" and traj.info["total"] > 0
    [seg] = traj.segments
    text = tok.decode(client.requests[1].prompt_ids)
    assert "42" in text and "run_python" in text  # the tool's output, framed by the template
    model_ids = [i for i, m in zip(seg.completion_ids, seg.loss_mask) if m]
    assert model_ids == tok.encode(client.turns[0]) + end + tok.encode(client.turns[1]) + end


def test_the_harness_corpus_is_its_conversations_through_the_template(monkeypatch):
    """corpus_command gets training tasks and prints conversations; each becomes a document in
    the plain template, the tool calls in the format the gateway parses back."""
    from tidal.chat.tool_calls import parse_tool_calls

    monkeypatch.chdir(AGENT.parent.parent)  # relative paths in a command are made absolute
    spec = load_environment("harness", command="{python} examples/harness_agent.py",
                            corpus_command="{python} examples/harness_agent.py --corpus",
                            task_args={"prompt_style": "instruct"})
    assert str(AGENT) in spec.outside.config.command
    docs = spec.build_corpus(4, 0)
    assert len(docs) == 4
    for doc in docs:
        assert doc.startswith("<|system|>\n") and "<tools>" in doc and doc.endswith("<|end|>\n")
        replies = [part.split("<|end|>")[0] for part in doc.split("<|assistant|>\n")[1:]]
        calls = [parse_tool_calls(r, ["run_python", "write_file", "submit"]).calls for r in replies]
        assert [c[0].name for c in calls] == ["run_python", "submit"]
        code = json.loads(calls[1][0].arguments_json)["code"]
        assert code.startswith("def f(x):")
    held_out = {t.instruction for t in spec.sample_tasks(200, 0, True)}
    assert not any(text in doc for doc in docs for text in held_out)  # training tasks only


def test_a_corpus_command_that_fails_is_a_clear_error():
    from tidal.errors import UserError

    spec = load_environment("harness", command="true", corpus_command="{python} -c 'import sys; sys.exit(4)'")
    with pytest.raises(UserError, match="exited with code 4"):
        spec.build_corpus(2, 0)


def test_a_steps_gateway_metrics_count_matched_history(tok):
    """gateway/* keys of a step: a faithful harness matches every later turn, an editing one
    none; steps of native environments have no gateway keys."""
    from tidal.orchestrator.run_output import rollout_metrics

    faithful, _ = _run(tok, "answer", samples=1)
    editing, _ = _run(tok, "edit", samples=1)
    both = rollout_metrics(faithful + editing).to_json()
    assert both["gateway/turns"] == 2.0 and both["gateway/history_match_fraction"] == 0.5
    assert both["gateway/new_segments"] == 1.5
    assert rollout_metrics(faithful).to_json()["gateway/history_match_fraction"] == 1.0
    native = [t for t in faithful]
    for t in native:
        t.info = {k: v for k, v in t.info.items() if not k.startswith("gateway_")}
    assert not any(k.startswith("gateway/") for k in rollout_metrics(native).to_json())


@pytest.mark.parametrize("model", ["byte", "qwen-template"])
def test_the_native_agent_and_the_example_over_the_gateway_train_on_the_same_tokens(tmp_path, model):
    """env.name "agent" (the example's prompt and tools run by tidal's own tool-calling loop)
    and examples/harness_agent.py over the gateway, given the same sampled turns, build the same
    trajectory token for token, and the native side extends one segment too."""
    from tidal.config import load_config
    from tidal.sandbox import Sandbox

    tok, end = _tool_model(model, tmp_path)
    out = {}
    with Sandbox(load_config(None, []).env.sandbox) as sandbox:
        for name, args in (("harness", {"command": f"{{python}} {AGENT}"}), ("agent", {})):
            spec = load_environment(name, sandbox=sandbox, task_args={"prompt_style": "instruct"},
                                    **args)
            [traj], _ = run_episodes(_engine(tok, 4096), spec, spec.sample_tasks(1, 0, False),
                                     HarnessConfig(), client=ToolSampler(tok, end), seed=0)
            out[name] = traj
    native, gateway = out["agent"], out["harness"]
    assert native.info["tool_history_matched"] == 1 and native.info["tool_new_segments"] == 1
    assert (native.reward, native.reason) == (gateway.reward, gateway.reason) == (0.0, "wrong_answer")
    [a], [b] = native.segments, gateway.segments
    assert (a.prompt_ids, a.completion_ids, a.loss_mask) == (b.prompt_ids, b.completion_ids, b.loss_mask)
    assert "42" in tok.decode(a.completion_ids)  # run_python ran in tidal's sandbox


def test_the_native_agent_has_the_example_agents_prompt_and_tools():
    import runpy

    from tidal.families.agent import SYSTEM, TOOLS

    example = runpy.run_path(str(AGENT), run_name="example")
    assert (SYSTEM, TOOLS) == (example["SYSTEM"], example["TOOLS"])


def test_the_fork_servers_warm_up_runs_once_before_every_harness(tmp_path, monkeypatch, tok):
    """env.args.warmup runs in the fork server after its imports: every forked harness sees
    what it did (here a module attribute), so lazy work is done once, not per episode."""
    from tidal.config import load_config
    from tidal.sandbox import Sandbox

    out = tmp_path / "seen"
    harness = tmp_path / "warm_harness.py"
    harness.write_text("import json, os\n"
                       "open(os.environ['WARM_OUT'], 'a').write(str(getattr(json, 'WARMED', False)) + '\\n')\n")
    monkeypatch.setenv("WARM_OUT", str(out))
    with Sandbox(load_config(None, []).env.sandbox) as sandbox:
        spec = load_environment("harness", sandbox=sandbox, command=f"{{python}} {harness}",
                                preload=["json"], warmup="import json; json.WARMED = True")
        trajs, _ = run_episodes(_engine(tok), spec, spec.sample_tasks(1, 0, False), HarnessConfig(),
                                samples_per_task=2, client=Sampler(tok), seed=0)
    assert out.read_text().split() == ["True", "True"]
    assert {t.reason for t in trajs} == {"no_answer"}


class Stalled(Sampler):
    """An engine that never answers (one stopped with its rollout)."""

    async def generate(self, request):
        self.requests.append(request)
        await asyncio.Event().wait()


def test_a_request_in_flight_when_its_episode_times_out_does_not_hold_the_rollout(tok):
    """The harness is stopped at its timeout while its request waits on the engine; the rollout
    call still returns (the gateway does not wait for that request to be answered)."""
    import threading

    done, client = {}, Stalled(tok)

    def go():
        done["trajs"] = _run(tok, "answer", samples=1, client=client, timeout_s=3.0,
                             preload=["openai"])[0]

    worker = threading.Thread(target=go, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the rollout call hung after its episode timed out"
    assert [t.reason for t in done["trajs"]] == ["timeout"]
    assert client.requests, "the harness never reached the engine: nothing was in flight"
