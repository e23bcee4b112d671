"""Environment API: tools from typed functions, the tool-call parser, every kind of bad call,
rubrics, and the registry."""

import asyncio
import json

import pytest

from tidal.env import (CALL_CLOSE, EnvironmentSpec, Rubric, ToolEnvironment, ToolError, ToolSet,
                       format_call, load_environment, parse_call)
from tidal.env.registry import UnknownEnvironment
from tidal.env.toolcall import MalformedCall


class Box(ToolEnvironment):
    """A tiny tool environment: a dict of named integers."""

    max_call_chars = 200
    tool_timeout_s = 0.2

    def __init__(self):
        super().__init__(Rubric([(has_answer, 1.0), (no_errors, 0.5)]))
        self.values: dict[str, int] = {}
        self.answer: int | None = None

    async def setup(self, task) -> str:
        return f"Task: {task}"

    def tools(self):
        return [self.put, self.get, self.submit, self.slow]

    def put(self, name: str, value: int) -> str:
        """Store an integer under a name.

        This second paragraph is not part of the description."""
        self.values[name] = value
        return "ok"

    def get(self, name: str) -> int:
        """Read a stored integer."""
        if name not in self.values:
            raise ToolError(f"nothing stored under {name!r}")
        return self.values[name]

    def submit(self, answer: int) -> str:
        """Give the final answer."""
        self.answer = answer
        self.finish()
        return "submitted"

    async def slow(self) -> str:
        """Never answers in time."""
        await asyncio.sleep(5)
        return "late"


def has_answer(task, env) -> float:
    return 1.0 if env.answer == 42 else 0.0


async def no_errors(task, env) -> float:
    return 1.0 if env.tool_errors == 0 else 0.0


def run(coro):
    return asyncio.run(coro)


async def episode(*actions):
    env = Box()
    head = await env.reset("store things")
    results = [await env.step(a) for a in actions]
    await env.close()
    return head, env, results


def test_tool_schema_comes_from_type_hints_and_docstring():
    env = Box()
    tools = ToolSet(env.tools()).tools
    put = tools["put"]
    assert put.description == "Store an integer under a name."
    assert put.schema["properties"] == {"name": {"type": "string"}, "value": {"type": "integer"}}
    assert put.schema["required"] == ["name", "value"]
    assert put.signature() == "put(name: string, value: integer) - Store an integer under a name."
    assert put.call_form() == "put(name: string, value: integer)"
    line = json.loads(put.json_line())
    assert line["name"] == "put" and line["parameters"]["additionalProperties"] is False


def test_a_property_named_title_survives_title_stripping():
    def note(title: str, body: str = "") -> str:
        """Write a note."""
        return title

    schema = ToolSet([note]).tools["note"].schema
    assert set(schema["properties"]) == {"title", "body"} and schema["required"] == ["title"]


def test_a_tool_without_docstring_is_refused():
    def nodoc(x: int) -> int:
        return x

    with pytest.raises(TypeError, match="docstring"):
        ToolSet([nodoc])


def test_head_lists_tools_and_the_task():
    head, _, _ = run(episode())
    assert head.startswith(Box.system_prompt)
    assert '"name":"put"' in head and head.rstrip().endswith("Task: store things")


def test_good_calls_run_and_submit_scores_with_the_rubric():
    _, env, results = run(episode(
        "I will store it. " + format_call("put", {"name": "a", "value": 42}),
        format_call("get", {"name": "a"}),
        format_call("submit", {"answer": 42}),
    ))
    assert [r.observation for r in results] == ["ok", "42", "submitted"]
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].reward == pytest.approx(1.5)
    assert results[-1].info == {"reward/has_answer": 1.0, "reward/no_errors": 1.0, "reason": "done"}


BAD_CALLS = [
    ("no_call", "I am thinking about it."),
    ("unclosed", '<call>{"put": {"name": "a", "value": 1}}'),
    ("bad_json", '<call>{"put": {"name": "a", "value": 1}</call>'),
    ("bad_json", "<call>" + "[" * 150 + "</call>"),
    ("not_object", '<call>["put", {"name": "a"}]</call>'),
    ("not_object", '<call>{"put": {"name": "a"}, "get": {}}</call>'),
    ("not_object", '<call>{"put": [1, 2]}</call>'),
    ("unknown_tool", '<call>{"rm": {"path": "/"}}</call>'),
    ("bad_args", '<call>{"put": {"name": "a", "value": "1"}}</call>'),
    ("bad_args", '<call>{"put": {"name": "a"}}</call>'),
    ("bad_args", '<call>{"put": {"name": "a", "value": 1, "extra": 2}}</call>'),
    ("bad_args", '<call>{"put": {"self": 0, "name": "a", "value": 1}}</call>'),  # tools are bound once
    ("too_long", '<call>{"put": {"name": "' + "a" * 300 + '", "value": 1}}</call>'),
    ("tool_error", '<call>{"get": {"name": "missing"}}</call>'),
    ("timeout", '<call>{"slow": {}}</call>'),
]


@pytest.mark.parametrize("kind,action", BAD_CALLS, ids=[f"{k}-{i}" for i, (k, _) in enumerate(BAD_CALLS)])
def test_each_bad_call_gets_an_observation_naming_the_problem(kind, action):
    _, env, (result,) = run(episode(action))
    assert result.info == {"tool_error": kind}
    assert result.observation.startswith(f"error ({kind}): ")
    assert not result.done and result.reward == 0.0
    assert env.tool_errors == 1 and env.turns == 1


def test_bad_call_messages_say_what_to_fix():
    cases = dict((k, a) for k, a in BAD_CALLS)
    msg = {k: run(episode(a))[2][0].observation for k, a in cases.items()}
    assert "value: Input should be a valid integer" in run(episode(BAD_CALLS[8][1]))[2][0].observation
    assert "missing" in msg["tool_error"] and "'rm'" in msg["unknown_tool"]
    assert "put, get, submit, slow" in msg["unknown_tool"]
    assert "limit is 200" in msg["too_long"] and CALL_CLOSE in msg["unclosed"]


def test_the_episode_continues_after_errors_and_the_rubric_sees_them():
    _, env, results = run(episode(BAD_CALLS[0][1], format_call("submit", {"answer": 42})))
    assert results[-1].done and results[-1].reward == pytest.approx(1.0)  # no_errors term lost


def test_a_huge_integer_is_bad_json_not_a_crash():
    with pytest.raises(MalformedCall) as err:
        parse_call('<call>{"get": {"name": ' + "9" * 5000 + "}}</call>", 10_000)
    assert err.value.kind == "bad_json"


def test_parse_call_takes_the_last_call_and_keeps_free_text_before_it():
    call = parse_call('x <call>{"a":{}}</call> y <call>{"b":{"k":1}}</call>', 100)
    assert (call.name, call.args) == ("b", {"k": 1})
    with pytest.raises(MalformedCall):
        parse_call("", 100)


def test_rubric_weights_and_parts():
    def one(task, state):
        return 1.0

    async def half(task, state):
        return 0.5

    score = run(Rubric([(one, 2.0), (half, -1.0)]).score(None, None))
    assert score.total == pytest.approx(1.5) and score.parts == {"one": 1.0, "half": 0.5}
    with pytest.raises(ValueError, match="distinct"):
        Rubric([(one, 1.0), (one, 2.0)])


def test_registry_loads_builtins_and_module_paths_and_names_unknowns():
    spec = load_environment("funcs", sandbox=None)
    assert isinstance(spec, EnvironmentSpec) and spec.name == "funcs"
    by_path = load_environment("tidal.families.fixit", sandbox=None, max_level=1)
    assert by_path.name == "fixit" and all(t.tests.level == 1 for t in by_path.sample_tasks(4, 0, False))
    for unknown in ("no_such_env_anywhere", "tidal.env.no_such_module"):
        with pytest.raises(UnknownEnvironment, match="not a known environment"):
            load_environment(unknown)
    with pytest.raises(UnknownEnvironment, match="no load_environment"):
        load_environment("tidal.env.base")


def test_env_name_and_args_come_from_the_config():
    from tidal.config import load_config
    from tidal.env import from_config

    cfg = load_config(None, ["--env.name", "fixit", "--env.args", '{"min_level": 2, "max_level": 2}'])
    spec = from_config(cfg.env, sandbox=None)
    assert {t.tests.level for t in spec.sample_tasks(5, 1, False)} == {2}
    cfg = load_config(None, ["--env.args.max_level", "1"])  # one key, the rest defaults
    assert {t.level for t in from_config(cfg.env).sample_tasks(5, 1, False)} == {1}
