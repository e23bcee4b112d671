"""The "agent" family: examples/harness_agent.py's tools run natively in tidal's sandbox."""

from __future__ import annotations

import asyncio
import json

import pytest

from tidal.env.registry import load_environment


def _call(name: str, **args) -> dict:
    return {"id": f"call_{name}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}


@pytest.fixture
def spec():
    from tidal.config import load_config
    from tidal.sandbox import Sandbox

    with Sandbox(load_config(None, []).env.sandbox) as sandbox:
        yield load_environment("agent", sandbox=sandbox, task_args={"prompt_style": "instruct"})


def _episode(spec, *replies):
    """reset, then each reply in turn; the step results."""
    async def go():
        env = spec.make()
        task = spec.sample_tasks(1, 3, False)[0]
        first = await env.reset(task)
        steps = [await env.step(r) for r in replies]
        await env.close()
        return task, first, steps
    return asyncio.run(go())


def test_tools_run_in_the_sandbox_and_see_written_files(spec):
    write = {"role": "assistant", "content": None, "tool_calls": [
        _call("write_file", path="lib.py", content="K = 41\n"),
        _call("run_python", code="import lib; print(lib.K + 1)"),
        _call("run_python", code="x"),
        _call("write_file", path="../up.py", content=""),
        _call("run_python", cmd="print(1)")]}
    task, first, [step] = _episode(spec, write)
    assert [m["role"] for m in first] == ["system", "user"] and first[1]["content"] == task.instruction
    outs = [m["content"] for m in step.observation]
    assert [m["tool_call_id"] for m in step.observation] == [c["id"] for c in write["tool_calls"]]
    assert outs[0] == "wrote 7 characters to lib.py" and outs[1] == "42\n"
    assert "NameError" in outs[2] and outs[3].startswith("error:") and "TypeError" in outs[4]
    assert not step.done


def test_submit_or_a_plain_reply_is_graded_by_the_family(spec):
    task = spec.sample_tasks(1, 3, False)[0]
    right = "def f(x):\n" + task.reference_solution.rstrip() + "\n"
    _, _, [submitted] = _episode(spec, {"role": "assistant", "content": None,
                                        "tool_calls": [_call("submit", code=right)]})
    assert submitted.done and submitted.reward == 1.0
    _, _, [plain] = _episode(spec, {"role": "assistant", "content": f"Here:\n```python\n{right}```"})
    assert plain.done and plain.reward == 1.0
    _, _, [wrong] = _episode(spec, {"role": "assistant", "content": "def f(x):\n    return None\n"})
    assert wrong.done and wrong.reward == 0.0


def test_the_agent_family_cannot_wrap_itself():
    from tidal.errors import UserError

    with pytest.raises(UserError, match="env.args.tasks"):
        load_environment("agent", tasks="agent")
