"""A small coding agent, written only with the `openai` package: the kind of harness a product
already has, trained by tidal without changing a line (see docs/harness.md).

It reads its task as JSON on stdin ({"prompt": ...}), talks to whatever OPENAI_BASE_URL and
OPENAI_API_KEY point at, and works in its current folder with three tools: run_python (run a
snippet, see its output), write_file, and submit (its final code, left in answer.txt). Its loop:
ask the model, run the tools it calls, send back their results, until it submits or runs out of
turns. A reply with no tool call is taken as the answer (its fenced code block, if any).

    python examples/harness_agent.py < task.json          # against any OpenAI-compatible server
    python examples/harness_agent.py --corpus < tasks.jsonl  # its conversations, as JSONL
"""

import json
import os
import re
import subprocess
import sys

SYSTEM = "You are a coding agent. Use the tools: test your code with run_python, then submit it."
TOOLS = [
    {"type": "function", "function": {
        "name": "run_python", "description": "Run Python code and return what it prints.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                       "required": ["code"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Write a file in the working folder.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "submit", "description": "Submit the final code (the task's function).",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                       "required": ["code"]}}},
]
MAX_TURNS = int(os.environ.get("AGENT_MAX_TURNS", "4"))
ANSWER_FILE = os.environ.get("TIDAL_ANSWER_FILE", "answer.txt")


def run_python(code: str) -> str:
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=5)
        out = done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        out = "timed out after 5 s"
    return out[-500:] or "(no output)"


def write_file(path: str, content: str) -> str:
    if os.path.isabs(path) or ".." in path.split("/"):
        return "error: write inside the working folder"
    with open(path, "w") as f:
        f.write(content)
    return f"wrote {len(content)} characters to {path}"


def submit(code: str) -> str:
    with open(ANSWER_FILE, "w") as f:
        f.write(code)
    return "submitted"


def call_tool(name: str, arguments: str) -> tuple[str, bool]:
    """(the tool's output, whether the episode is over)."""
    try:
        args = json.loads(arguments)
        out = {"run_python": run_python, "write_file": write_file, "submit": submit}[name](**args)
    except (ValueError, KeyError, TypeError) as e:
        return f"error: {type(e).__name__}: {e}", False
    return out, name == "submit"


def code_of(text: str) -> str:
    blocks = re.findall(r"```(?:python)?\n(.*?)```", text, re.S)
    return blocks[0] if blocks else text


def main() -> None:
    import openai

    task = json.load(sys.stdin)
    client = openai.OpenAI(max_retries=0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["prompt"]}]
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model=os.environ.get("AGENT_MODEL", "tidal"),
                                               messages=messages, tools=TOOLS).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            submit(code_of(reply.content or ""))
            return
        for call in reply.tool_calls:
            out, over = call_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": out})
            if over:
                return


def corpus() -> None:
    """Its own conversations (a product's logs): for each task on stdin (tidal's funcs task
    records: "prompt", "reference_solution", "tests"), the conversation this agent has when it
    tests a correct solution on the first example and submits it, as {"messages", "tools"}."""
    for line in sys.stdin:
        task = json.loads(line)
        code = "def f(x):\n" + task["reference_solution"].rstrip() + "\n"
        x, y = task["tests"][0]
        calls = [("call_1", "run_python", {"code": f"{code}print(f({x}))"}, str(y)),
                 ("call_2", "submit", {"code": code}, "submitted")]
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["prompt"]}]
        for call_id, name, args, out in calls:
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": name, "arguments": json.dumps(args)}}]})
            messages.append({"role": "tool", "tool_call_id": call_id, "content": out})
        print(json.dumps({"messages": messages, "tools": TOOLS}))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--corpus"]:
        corpus()
    else:
        main()
