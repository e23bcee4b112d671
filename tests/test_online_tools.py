"""Function calling in `tidal serve` (api/tools.py): the parser and the streaming hold-back by
themselves, the rendering of tools and tool turns against transformers' apply_chat_template
(Qwen2.5's real template, tests/data/README.md), and the API through the official openai client.

The tiny random model never writes a tool call, so the API tests script the policy's replies:
ScriptedPolicy is the real PolicyServer (routes, prompt checks, status) whose ``generate``
returns chosen texts as token ids, streamed a few tokens per event, when a script is queued."""

import asyncio
import json
import urllib.request
from pathlib import Path

import openai
import pytest

from chat_tokenizer import chatml_config, tiny_tokenizer
from tidal.engine.config import EngineConfig
from tidal.engine.request import GenerationResult
from tidal.model.presets import preset
from tidal.model.qwen3 import build_model
from tidal.model.tokenizer import ByteTokenizer
from tidal.online.api import create_app
from tidal.chat.template import ChatTemplate, plain_call, plain_prompt
from tidal.chat.tool_calls import ParsedReply, ToolStream, ToolUse, parse_tool_calls, template_messages
from tidal.online.config import OnlineConfig
from tidal.online.memory import MemoryStore
from tidal.online.records import VersionRecord
from tidal.online.serving import Generation, PolicyServer, StreamEvent
from tidal.online.version_sync import VersionLoader, publish_model

from app_thread import AppThread

TOK = ByteTokenizer()
QWEN_TEMPLATE = (Path(__file__).parent / "data" / "qwen2_5_chat_template.jinja").read_text()
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
NOW = {"type": "function", "function": {"name": "now"}}
TOOLS = [ADD, NOW]
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 2}}\n</tool_call>'


# ---------------------------------------------------------------- the parser


def test_parse_content_then_calls_as_vllm_hermes():
    text = f'Let me add.\n{CALL}\n<tool_call>\n{{"name": "now", "arguments": {{}}}}\n</tool_call>'
    reply = parse_tool_calls(text, ["add", "now"])
    assert reply.content == "Let me add.\n" and reply.malformed is None
    assert [(c.name, json.loads(c.arguments_json)) for c in reply.calls] == [("add", {"a": 2, "b": 2}),
                                                                           ("now", {})]
    assert all(c.id.startswith("call_") for c in reply.calls)
    assert len({c.id for c in reply.calls}) == 2
    assert parse_tool_calls(CALL, ["add"]).content is None  # nothing before the call
    assert parse_tool_calls("just prose", ["add"]) == ParsedReply("just prose")


@pytest.mark.parametrize("text, why", [
    ("<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2}\n</tool_call>", "not valid JSON"),
    ("<tool_call>\n{\"name\": \"sub\", \"arguments\": {}}\n</tool_call>", "'sub'"),
    ("<tool_call>\n{\"name\": \"add\", \"arguments\": \"{}\"}\n</tool_call>", "JSON object"),
    ("<tool_call>\n{\"name\": \"add\"}\n</tool_call>", "JSON object"),
    ("<tool_call>\n[1, 2]\n</tool_call>", "JSON object"),
    ("<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": NaN}}\n</tool_call>", "not valid JSON"),
    ("ok " + CALL + "\n<tool_call>\n{\"name\": \"add\", \"arguments\": {}}", "not closed"),
])
def test_malformed_calls_come_back_as_the_whole_text(text, why):
    reply = parse_tool_calls(text, ["add"])
    assert reply.calls == [] and reply.content == text
    assert why in reply.malformed


def test_tool_choice_and_parallel_rules():
    two = f"{CALL}\n<tool_call>\n{{\"name\": \"now\", \"arguments\": {{}}}}\n</tool_call>"
    assert len(ToolUse(TOOLS).reply(two).calls) == 2
    assert [c.name for c in ToolUse(TOOLS, parallel=False).reply(two).calls] == ["add"]
    assert [c.name for c in ToolUse(TOOLS, choice="now").reply(two).calls] == ["now"]
    none = ToolUse(TOOLS, choice="none").reply(two)  # not parsed at all (vLLM's "none")
    assert none == ParsedReply(two)
    unmet = ToolUse(TOOLS, choice="required").reply("no call")
    assert unmet.unmet and unmet.content == "no call" and unmet.calls == []
    assert ToolUse([ADD], choice="add").reply("<tool_call>\n{}").unmet
    assert not ToolUse(TOOLS).reply("no call").unmet


def test_stream_holds_back_what_could_become_a_tag():
    text = f"Sum: 2<3 and <tool <b>. {CALL} trailing"
    stream, sent = ToolStream(), []
    for ch in text:  # one character at a time: the worst case for a tag split across deltas
        out = stream.add(ch)
        sent.append(out)
        assert not "".join(sent).endswith("<tool_")  # a possible tag never goes out early
    reply = ToolUse(TOOLS).reply(text)
    rest = stream.finish(text, reply)
    assert "".join(sent) + rest == reply.content == "Sum: 2<3 and <tool <b>. "
    bad = "x <tool_call>{oops"
    stream = ToolStream()
    got = "".join(stream.add(ch) for ch in bad)
    assert got == "x " and got + stream.finish(bad, ToolUse(TOOLS).reply(bad)) == bad


# ---------------------------------------------------------------- rendering


ROUND = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "4"},
]


def test_tools_render_as_transformers_apply_chat_template(tmp_path):
    """Qwen2.5's template with tools, an assistant tool call (arguments a JSON string, as OpenAI
    sends them) and a tool result: ChatTemplate equals transformers on the same messages."""
    from transformers import AutoTokenizer

    folder = tiny_tokenizer(tmp_path / "qwen", chatml_config(
        chat_template=QWEN_TEMPLATE, bos_token=None, pad_token="<|endoftext|>"))
    messages = template_messages(ROUND)
    ours = ChatTemplate.from_checkpoint(folder).render(messages, TOOLS)
    reference = AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(
        messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert ours == reference
    assert json.dumps(ADD) in ours  # each tool's JSON inside <tools>
    # arguments went in as an object (vLLM's parsing): a JSON string would render quoted
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 2}}'
            '\n</tool_call>') in ours
    assert ours.endswith("<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    without = ChatTemplate.from_checkpoint(folder).render(messages[:2])
    assert without == AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(
        messages[:2], tokenize=False, add_generation_prompt=True)


def test_plain_template_with_tools_reads_back():
    messages = template_messages([*ROUND[:2], {"role": "assistant", "content": "Adding.",
                                               "tool_calls": ROUND[2]["tool_calls"]}, ROUND[3]])
    text = plain_prompt(messages, TOOLS)
    system, rest = text.split("<|user|>\n", 1)
    assert system.startswith("<|system|>\nYou are terse.\n\n# Tools\n") and json.dumps(ADD) in system
    assert rest.endswith("<|tool|>\n<tool_response>\n4\n</tool_response><|end|>\n<|assistant|>\n")
    reply = "Adding." + plain_call(messages[2]["tool_calls"][0])
    assert f"<|assistant|>\n{reply}<|end|>\n" in text
    parsed = parse_tool_calls(reply, ["add"])  # what the model writes, read back exactly
    assert parsed.content == "Adding." and json.loads(parsed.calls[0].arguments_json) == {"a": 2, "b": 2}
    assert plain_prompt(MESSAGES[1:], TOOLS).startswith("<|system|>\n# Tools\n")  # a system turn added
    plain = plain_prompt(MESSAGES, None, add_generation_prompt=False)
    assert plain == "<|system|>\nbe brief<|end|>\n<|user|>\n2+2?<|end|>\n"


# ---------------------------------------------------------------- the API


class ScriptedPolicy(PolicyServer):
    """PolicyServer whose next ``generate`` returns ``script``'s texts (one per choice, then eos)
    instead of sampling, while a script is queued."""

    script: list[str] = []

    async def generate(self, prompt_ids, sampling, n=1, stream=False, version=None):
        if not self.script:
            return await super().generate(prompt_ids, sampling, n, stream, version)
        self.check_prompt(prompt_ids)
        version = self.route()
        gen = Generation(version, self.sha_of(version), n, asyncio.get_running_loop(), stream)
        for i in range(n):
            ids = TOK.encode(self.script.pop(0)) + [TOK.eos_id]
            result = GenerationResult(i, list(prompt_ids), ids, [-0.5] * len(ids),
                                      [version] * len(ids), None, "eos", TOK.decode(ids))
            for at in range(0, len(ids), 3) if stream else ():
                done = at + 3 >= len(ids)
                gen.queue.put_nowait(StreamEvent(i, ids[at:at + 3], result.logprobs[at:at + 3],
                                                 result if done else None))
            gen.futures[i].set_result(result)
        return gen


class Served:
    """The app over a ScriptedPolicy on uvicorn in a thread (no API keys); ``client``: openai."""

    def __init__(self, tmp_path):
        arch = preset("tiny").model_copy(update={"initializer_range": 0.1,
                                                 "max_position_embeddings": 1024})
        model = build_model(arch, seed=0).eval()
        sha = publish_model(model, tmp_path / "weights", 0, "float32")
        self.loader = VersionLoader(tmp_path / "weights")
        engine_cfg = EngineConfig(max_batch_size=4, max_seq_len=1024, max_new_tokens=32, stop=[])
        self.policy = ScriptedPolicy(engine_cfg, TOK, self.loader)
        self.policy.script = []
        self.policy.refresh([VersionRecord(0, None, sha, "live", 0.0)])
        self.store = MemoryStore()
        cfg = OnlineConfig.model_validate({"serve": {"max_tokens": 64, "max_n": 4}})
        app = create_app(cfg, self.policy, self.store, self.store, keys=None)
        self.app_thread = AppThread(app)
        base = f"http://127.0.0.1:{self.app_thread.port}"
        self.client = openai.OpenAI(api_key="unused", base_url=f"{base}/v1", max_retries=0)
        self.status_url = f"{base}/v1/tidal/status"

    def chat(self, replies: list[str], **kw):
        self.policy.script = list(replies)
        return self.client.chat.completions.create(model="tidal", **kw)

    def status(self) -> dict:
        with urllib.request.urlopen(self.status_url) as r:
            return json.loads(r.read())

    def close(self):
        self.app_thread.stop()
        self.loader.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    s = Served(tmp_path_factory.mktemp("tools"))
    yield s
    s.close()


def test_a_tool_call_reply(served):
    r = served.chat([f"Adding.{CALL}"], messages=MESSAGES, tools=TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Adding."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "add" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"a": 2, "b": 2}
    rec = served.store.responses[(r.id, 0)]
    assert rec.text == f"Adding.{CALL}" and rec.finish_reason == "tool_calls"  # as sampled
    assert rec.token_ids == TOK.encode(rec.text) + [TOK.eos_id]
    assert rec.prompt_ids == TOK.encode(plain_prompt(template_messages(MESSAGES), TOOLS), add_bos=True)
    only = served.chat([CALL], messages=MESSAGES, tools=TOOLS, tool_choice="auto")
    assert only.choices[0].message.content is None  # null content when only calls came


def test_streamed_tool_calls_accumulate_as_the_whole_response(served):
    text = (f"Sum <tool? not yet.\n{CALL}\n"
            '<tool_call>\n{"name": "now", "arguments": {"tz": "UTC"}}\n</tool_call>')
    whole = served.chat([text], messages=MESSAGES, tools=TOOLS)
    served.policy.script = [text]
    deltas = []
    with served.client.chat.completions.stream(model="tidal", messages=MESSAGES,
                                               tools=TOOLS) as stream:
        for event in stream:
            if event.type == "chunk":
                deltas += [d for c in event.chunk.choices for d in (c.delta.tool_calls or [])]
        streamed = stream.get_final_completion()
    a, b = whole.choices[0], streamed.choices[0]
    assert b.finish_reason == a.finish_reason == "tool_calls"
    assert b.message.content == a.message.content == "Sum <tool? not yet.\n"
    assert [(c.function.name, c.function.arguments) for c in b.message.tool_calls] == \
           [(c.function.name, c.function.arguments) for c in a.message.tool_calls]
    assert [c.id for c in b.message.tool_calls] == [d.id for d in deltas if d.id]  # one id each
    assert deltas[0].function.arguments == "" and deltas[0].type == "function"


def test_a_full_tool_round_trip(served):
    first = served.chat([CALL], messages=MESSAGES, tools=TOOLS)
    assistant = first.choices[0].message
    history = [*MESSAGES, assistant.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": assistant.tool_calls[0].id, "content": "4"}]
    second = served.chat(["It is 4."], messages=history, tools=TOOLS)
    assert second.choices[0].message.content == "It is 4." and second.choices[0].finish_reason == "stop"
    assert not second.choices[0].message.tool_calls
    prompt = TOK.decode(served.store.responses[(second.id, 0)].prompt_ids)
    assert prompt.endswith(f"<|assistant|>\n{CALL}<|end|>\n<|tool|>\n<tool_response>\n4\n"
                           "</tool_response><|end|>\n<|assistant|>\n")


def test_malformed_and_unmet_replies_are_content_and_counted(served):
    before = served.status()
    bad = 'On it. <tool_call>\n{"name": "add", "arguments": [2, 2]}\n</tool_call>'
    r = served.chat([bad], messages=MESSAGES, tools=TOOLS)
    assert r.choices[0].message.content == bad and r.choices[0].finish_reason == "stop"
    assert not r.choices[0].message.tool_calls
    chunks = list(served.chat([bad], messages=MESSAGES, tools=TOOLS, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == bad
    assert chunks[-1].choices[0].finish_reason == "stop"
    required = served.chat(["I would rather not."], messages=MESSAGES, tools=TOOLS, tool_choice="required")
    assert required.choices[0].message.content == "I would rather not."
    named = served.chat([CALL], messages=MESSAGES, tools=TOOLS,
                        tool_choice={"type": "function", "function": {"name": "now"}})
    assert named.choices[0].finish_reason == "stop" and named.choices[0].message.content == CALL
    none = served.chat([CALL], messages=MESSAGES, tools=TOOLS, tool_choice="none")
    assert none.choices[0].message.content == CALL and none.choices[0].finish_reason == "stop"
    after = served.status()
    assert after["tool_calls_malformed"] - before["tool_calls_malformed"] == 2
    assert after["tool_choice_unmet"] - before["tool_choice_unmet"] == 2
    assert after["tool_calls_returned"] == before["tool_calls_returned"]


def test_parallel_tool_calls_false_keeps_the_first(served):
    two = f"{CALL}\n<tool_call>\n{{\"name\": \"now\", \"arguments\": {{}}}}\n</tool_call>"
    r = served.chat([two, two], messages=MESSAGES, tools=TOOLS, parallel_tool_calls=False, n=2)
    assert [[c.function.name for c in ch.message.tool_calls] for ch in r.choices] == [["add"], ["add"]]


def test_the_real_model_serves_a_tools_request(served):
    r = served.client.chat.completions.create(model="tidal", messages=MESSAGES, tools=TOOLS,
                                              max_tokens=6, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert isinstance(r.choices[0].message.content, str)


@pytest.mark.parametrize("change, param", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}, "tools[0].function.name"),
    ({"tools": [NOW, NOW]}, "tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "mul"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"parallel_tool_calls": False}, "parallel_tool_calls"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": True}}]},
     "tools[0].function.strict"),
    ({"messages": [*MESSAGES, {"role": "tool", "tool_call_id": "call_x", "content": "4"}]},
     "messages[2].tool_call_id"),
    ({"messages": [*MESSAGES, {"role": "tool", "content": "4"}]}, "messages[2]"),
    ({"messages": [*MESSAGES, {**ROUND[2], "tool_calls": [{**ROUND[2]["tool_calls"][0], "function": {
        "name": "add", "arguments": "{oops"}}]}]}, "messages[2].tool_calls[0].function.arguments"),
])
def test_bad_tool_requests_are_400s_naming_the_field(served, change, param):
    body = {"model": "tidal", "messages": MESSAGES, **change}
    with pytest.raises(openai.BadRequestError) as e:
        served.client.chat.completions.create(**body)
    assert e.value.body["param"] == param, e.value.body
