"""The HTTP API of `tidal serve`, checked with the official openai client as a user would (and
raw HTTP for what a client library would never send): a tiny random model on the byte
tokenizer, served by the real app under uvicorn on a free port."""

import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tidal.engine.config import EngineConfig
from tidal.model.presets import preset
from tidal.model.qwen3 import build_model
from tidal.model.tokenizer import ByteTokenizer
from tidal.online.api import create_app
from tidal.online.api.auth import KeyRing
from tidal.chat.template import ChatTemplate, ChatTemplateError, plain_prompt
from tidal.online.config import OnlineConfig
from tidal.online.memory import MemoryStore
from tidal.online.records import VersionRecord
from tidal.online.serving import PolicyServer
from tidal.online.version_sync import VersionLoader, publish_model

from app_thread import AppThread

TOK = ByteTokenizer()
MAX_SEQ = 96
USER_KEY, ADMIN_KEY = "test-user-key-0123456789abcdef", "test-admin-key-0123456789abcdef"


def make_keys() -> KeyRing:
    """A user key (what ``Served.client`` and ``raw`` send) and an admin key."""
    ring = KeyRing()
    ring.add(USER_KEY, "user", "tests")
    ring.add(ADMIN_KEY, "admin", "tests")
    return ring


class Served:
    """The app on uvicorn in a thread; ``client``: the openai client pointed at it, with the
    user key of ``keys`` (default: make_keys(); ``no_auth``: none). ``start=False``: version 0
    is published (``weights``, ``sha``) but nothing serves until ``start(**create_app's
    live_versions, updater, registry)``."""

    def __init__(self, tmp_path, cfg: OnlineConfig | None = None, keys: KeyRing | None = None,
                 no_auth: bool = False, start: bool = True):
        model = build_model(preset("tiny").model_copy(update={"initializer_range": 0.1}), seed=0).eval()
        self.weights = tmp_path / "weights"
        self.sha = publish_model(model, self.weights, 0, "float32")
        self.loader = VersionLoader(self.weights)
        engine_cfg = EngineConfig(max_batch_size=8, max_seq_len=MAX_SEQ, max_new_tokens=32, stop=[])
        self.policy = PolicyServer(engine_cfg, TOK, self.loader)
        self.policy.refresh([VersionRecord(0, None, self.sha, "live", 0.0)])
        self.store = MemoryStore()
        self.keys = None if no_auth else keys if keys is not None else make_keys()
        self.cfg = cfg or OnlineConfig.model_validate(
            {"serve": {"max_tokens": 24, "max_n": 4, "max_body_bytes": 4096,
                       "max_feedback_bytes": 512}})
        if start:
            self.start()

    def start(self, **app_kw):
        app = create_app(self.cfg, self.policy, self.store, self.store, keys=self.keys, **app_kw)
        self.app_thread = AppThread(app)
        self.port = self.app_thread.port
        self.client = self.client_with(USER_KEY)

    def client_with(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(api_key=key, base_url=f"http://127.0.0.1:{self.port}/v1",
                             max_retries=0)

    def raw(self, method: str, path: str, body: bytes | str | None = None, headers=None):
        """(status, headers, parsed JSON or text) of one plain HTTP request (with the user
        key unless ``headers`` has an Authorization of its own; a header None is not sent)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        if isinstance(body, str):
            body = body.encode()
        auth = {"Authorization": f"Bearer {USER_KEY}"} if self.keys is not None else {}
        sent = {"Content-Type": "application/json", **auth, **(headers or {})}
        conn.request(method, path, body=body, headers={k: v for k, v in sent.items() if v is not None})
        r = conn.getresponse()
        data = r.read()
        conn.close()
        try:
            return r.status, dict(r.getheaders()), json.loads(data)
        except ValueError:
            return r.status, dict(r.getheaders()), data.decode(errors="replace")

    def close(self):
        self.app_thread.stop()
        self.loader.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    s = Served(tmp_path_factory.mktemp("api"))
    yield s
    s.close()


def _names_policy(obj, served):
    assert obj.tidal_version == 0
    assert obj.tidal_manifest_sha256 == served.sha


# ---------------------------------------------------------------- completions


def test_completion_n2_logprobs_fields_and_records(served):
    raw = served.client.completions.with_raw_response.create(
        model="tidal", prompt="def f(", max_tokens=8, n=2, logprobs=1, temperature=0.8, seed=3)
    assert raw.headers["x-tidal-version"] == "0"
    assert raw.headers["x-tidal-manifest-sha256"] == served.sha
    r = raw.parse()
    assert r.id.startswith("cmpl-") and r.model == "tidal"
    _names_policy(r, served)
    assert [c.index for c in r.choices] == [0, 1]
    for c in r.choices:
        rec = served.store.responses[(r.id, c.index)]
        assert rec.version == 0 and rec.manifest_sha256 == served.sha
        assert rec.endpoint == "completions" and rec.prompt_ids == TOK.encode("def f(", add_bos=True)
        assert rec.text == c.text and rec.temperature == 0.8
        assert c.logprobs.token_logprobs == rec.logprobs[: len(c.logprobs.token_logprobs)]
        assert all(lp <= 0 for lp in c.logprobs.token_logprobs)
        assert [next(iter(d.values())) for d in c.logprobs.top_logprobs] == c.logprobs.token_logprobs
    assert r.choices[0].text != r.choices[1].text  # seeds 3 and 4: two different samples
    assert r.usage.prompt_tokens == 7  # BOS + 6 bytes, as the harness encodes


def test_openai_fields_at_their_neutral_values_are_accepted(served):
    """Clients send presence_penalty / frequency_penalty / logit_bias at their defaults; tidal
    does not implement them, so only the neutral value is accepted (others: 400, below)."""
    r = served.client.completions.create(model="tidal", prompt="x", max_tokens=4, temperature=0,
                                         presence_penalty=0, frequency_penalty=0.0, logit_bias={})
    assert r.choices[0].finish_reason in ("length", "stop", "eos")


def test_completion_token_prompt_matches_text_prompt(served):
    a = served.client.completions.create(model="tidal", prompt="hello", max_tokens=6, temperature=0)
    b = served.client.completions.create(model="tidal", prompt=TOK.encode("hello", add_bos=True), max_tokens=6,
                                         temperature=0)
    assert a.choices[0].text == b.choices[0].text


def _greedy(served, prompt, **kw):
    return served.client.completions.create(model="tidal", prompt=prompt, max_tokens=16,
                                            temperature=0, **kw).choices[0]


def test_stop_string_cuts_text(served):
    full = _greedy(served, "print(1 + 2)").text
    stop = next(ch for ch in full[2:] if ch != "\ufffd")
    cut = full[: full.index(stop)]
    c = _greedy(served, "print(1 + 2)", stop=[stop])
    assert c.text == cut and c.finish_reason == "stop"
    streamed = served.client.completions.create(model="tidal", prompt="print(1 + 2)", max_tokens=16,
                                                temperature=0, stop=stop, stream=True)
    chunks = list(streamed)
    assert "".join(ch.choices[0].text for ch in chunks) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_stream_completion_equals_non_stream(served):
    kw = {"model": "tidal", "prompt": "x = ", "max_tokens": 12, "temperature": 0.9, "seed": 11}
    whole = served.client.completions.create(**kw).choices[0]
    chunks = list(served.client.completions.create(stream=True, **kw))
    assert all(ch.tidal_version == 0 and ch.tidal_manifest_sha256 == served.sha for ch in chunks)
    assert len({ch.id for ch in chunks}) == 1 and chunks[0].id.startswith("cmpl-")
    assert "".join(ch.choices[0].text for ch in chunks) == whole.text
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason
    assert (chunks[0].id, 0) in served.store.responses  # recorded before the stream ended


# ---------------------------------------------------------------- chat


MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "fix f"}]


def test_chat_logprobs_and_record(served):
    r = served.client.chat.completions.create(model="tidal", messages=MESSAGES, max_tokens=8,
                                              logprobs=True, top_logprobs=1, temperature=0.7, seed=1)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    _names_policy(r, served)
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    rec = served.store.responses[(r.id, 0)]
    assert rec.endpoint == "chat" and rec.text == choice.message.content
    assert rec.prompt_ids == TOK.encode(plain_prompt(MESSAGES), add_bos=True)
    lps = [t.logprob for t in choice.logprobs.content]
    assert lps == rec.logprobs[: len(lps)]
    assert all(t.top_logprobs[0].logprob == t.logprob for t in choice.logprobs.content)


def test_chat_stream_equals_non_stream_n2(served):
    kw = {"model": "tidal", "messages": MESSAGES, "max_tokens": 10, "temperature": 1.0, "seed": 5,
          "n": 2}
    whole = served.client.chat.completions.create(**kw)
    texts = ["", ""]
    finish = [None, None]
    for ch in served.client.chat.completions.create(stream=True, **kw):
        assert ch.object == "chat.completion.chunk" and ch.tidal_version == 0
        for c in ch.choices:
            texts[c.index] += c.delta.content or ""
            finish[c.index] = c.finish_reason or finish[c.index]
    assert texts == [c.message.content for c in whole.choices]
    assert finish == [c.finish_reason for c in whole.choices]


def test_chat_template_from_checkpoint(tmp_path):
    template = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}U:{{ m['content'] }}\n"
                "{% elif m['role'] == 'assistant' %}A:{{ m['content'] }}{{ eos_token }}\n"
                "{% else %}{{ raise_exception('no ' + m['role'] + ' role') }}{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}A:{% endif %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": template, "bos_token": "<s>", "eos_token": {"content": "</s>"}}))
    chat = ChatTemplate.from_checkpoint(tmp_path)
    assert chat.kind == "hf"
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
            {"role": "user", "content": "fix"}]
    assert chat.render(msgs) == "<s>U:hi\nA:yo</s>\nU:fix\nA:"
    with pytest.raises(ChatTemplateError, match="no system role"):
        chat.render([{"role": "system", "content": "x"}])
    assert ChatTemplate.from_checkpoint(tmp_path / "missing").kind == "plain"
    assert plain_prompt(MESSAGES) == "<|system|>\nbe brief<|end|>\n<|user|>\nfix f<|end|>\n<|assistant|>\n"


def test_sandboxed_template_cannot_reach_python(tmp_path):
    bad = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    chat = ChatTemplate(bad)
    with pytest.raises(ChatTemplateError):
        chat.render([{"role": "user", "content": "x"}])


# ---------------------------------------------------------------- batching


def test_concurrent_requests_decode_together(served):
    policy = served.policy
    policy.pause()
    policy.max_batch = 0
    try:
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(served.client.completions.create, model="tidal",
                                   prompt=f"request {i}", max_tokens=6) for i in range(8)]
            while policy._inbox.qsize() < 8:  # all 8 queued while the engine is held
                time.sleep(0.01)
            policy.resume()
            results = [f.result() for f in futures]
    finally:
        policy.resume()
    assert policy.max_batch == 8
    assert len({r.id for r in results}) == 8


# ---------------------------------------------------------------- models, status


def test_models_and_status(served):
    models = served.client.models.list()
    assert [m.id for m in models.data] == ["tidal"]
    assert models.data[0].tidal_version == 0 and models.data[0].tidal_manifest_sha256 == served.sha
    assert served.client.models.retrieve("tidal").id == "tidal"
    with pytest.raises(openai.NotFoundError):
        served.client.models.retrieve("gpt-4")
    status, _, body = served.raw("GET", "/v1/tidal/status")
    assert status == 200 and body["live"] == 0 and body["versions"][0]["requests"] > 0


# ---------------------------------------------------------------- feedback


def _served_id(served) -> str:
    return served.client.completions.create(model="tidal", prompt="a", max_tokens=2).id


def test_feedback_stored_duplicate_unknown(served):
    rid = _served_id(served)
    ok = served.raw("POST", "/v1/feedback", json.dumps({"response_id": rid, "signal": "accepted"}))
    assert ok[0] == 200 and ok[2] == {"id": rid, "index": 0, "status": "stored"}
    dup = served.raw("POST", "/v1/feedback", json.dumps({"response_id": rid, "signal": "rejected"}))
    assert dup[0] == 409 and dup[2]["error"]["code"] == "duplicate"
    unknown = served.raw("POST", "/v1/feedback", json.dumps({"response_id": "cmpl-nope", "signal": "accepted"}))
    assert unknown[0] == 404 and unknown[2]["error"]["param"] == "response_id"
    wrong_index = served.raw("POST", "/v1/feedback",
                             json.dumps({"response_id": rid, "index": 1, "signal": "accepted"}))
    assert wrong_index[0] == 404
    stored = [e for e in served.store.feedback if e.response_id == rid]
    assert len(stored) == 1 and stored[0].signal == "accepted" and stored[0].received > 0


def test_feedback_scalar_rules(served):
    rid = _served_id(served)
    for body, param in [({"signal": "scalar"}, "value"), ({"signal": "scalar", "value": 1.5}, "value"),
                        ({"signal": "accepted", "value": 0.5}, "value"), ({"signal": "loved"}, "signal"),
                        ({"signal": "scalar", "value": "0.5"}, "value"), ({"signal": "scalar", "value": 1, "x": 1}, "x")]:
        status, _, err = served.raw("POST", "/v1/feedback", json.dumps({"response_id": rid, **body}))
        assert status == 400 and err["error"]["param"] == param, (body, err)
    assert not [e for e in served.store.feedback if e.response_id == rid]
    status, _, _ = served.raw("POST", "/v1/feedback",
                              json.dumps({"response_id": rid, "signal": "scalar", "value": -1}))
    assert status == 200 and served.store.feedback[-1].value == -1.0


def test_feedback_backpressure_429(served):
    rid = _served_id(served)
    served.store.max_backlog, served.store.retry_s = 0, 2.3
    try:
        status, headers, err = served.raw("POST", "/v1/feedback",
                                          json.dumps({"response_id": rid, "signal": "edited"}))
    finally:
        served.store.max_backlog = None
    assert status == 429 and headers["retry-after"] == "3" and err["error"]["type"] == "rate_limit_error"
    assert not [e for e in served.store.feedback if e.response_id == rid]


def _chunked(served, path: str, size: int):
    """POST a body of ``size`` bytes in chunks, with no Content-Length."""
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
    body = (b'{"response_id": "' + b"x" * size + b'"}')
    conn.request("POST", path, body=iter([body[i:i + 256] for i in range(0, len(body), 256)]),
                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {USER_KEY}"},
                 encode_chunked=True)
    r = conn.getresponse()
    data = json.loads(r.read())
    conn.close()
    return r.status, data


def test_oversized_bodies_413(served):
    big = json.dumps({"response_id": "x" * 600, "signal": "accepted"})
    assert served.raw("POST", "/v1/feedback", big)[0] == 413
    assert _chunked(served, "/v1/feedback", 2000)[0] == 413
    assert _chunked(served, "/v1/completions", 5000)[0] == 413
    prompt = json.dumps({"model": "tidal", "prompt": "y" * 5000})
    status, _, err = served.raw("POST", "/v1/completions", prompt)
    assert status == 413 and err["error"]["code"] == "body_too_large"


# ---------------------------------------------------------------- bad input


def test_bad_requests_name_their_field(served):
    cases = [
        ({"prompt": "x", "temperature": "hot"}, 400, "temperature"),
        ({"prompt": "x", "bogus": 1}, 400, "bogus"),
        ({"prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty"),
        ({"prompt": "x", "logit_bias": {"12": 3.0}}, 400, "logit_bias"),
        ({"prompt": "x", "max_tokens": 25}, 400, "max_tokens"),
        ({"prompt": "x", "n": 5}, 400, "n"),
        ({"prompt": "x", "top_p": 0}, 400, "top_p"),
        ({"prompt": "x", "stop": ["a", ""]}, 400, "stop[1]"),
        ({"prompt": "x", "model": "gpt-4"}, 404, "model"),
        ({"prompt": "z" * (MAX_SEQ + 5)}, 400, "prompt"),
        ({"prompt": [1, 2, 999]}, 400, "prompt"),
        ({"prompt": []}, 400, "prompt"),
        ({}, 400, "prompt"),
    ]
    for body, status, param in cases:
        got, _, err = served.raw("POST", "/v1/completions", json.dumps(body))
        assert (got, err["error"]["param"]) == (status, param), (body, err)
        assert set(err["error"]) == {"message", "type", "param", "code"}
    _, _, err = served.raw("POST", "/v1/completions", json.dumps({"prompt": "z" * (MAX_SEQ + 5)}))
    assert str(MAX_SEQ - 1) in err["error"]["message"] and err["error"]["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        served.client.completions.create(model="tidal", prompt="x", max_tokens=1000)
    with pytest.raises(openai.BadRequestError, match="role"):
        served.client.chat.completions.create(model="tidal", messages=[{"role": "robot", "content": "x"}])


FUZZ = [b"", b"{", b"null", b"[]", b"42", b'"prompt"', b"{'prompt': 'x'}", b'{"prompt": NaN}',
        b'{"prompt": "x", "max_tokens": -1}', b'{"prompt": "x", "max_tokens": 1e99}',
        b'{"prompt": "x", "max_tokens": true}', b'{"prompt": "x", "n": 0}', b'{"prompt": "x", "n": "2"}',
        b'{"prompt": "x", "temperature": 1e400}', b'{"prompt": "x", "temperature": -0.1}',
        b'{"prompt": "x", "seed": -5}', b'{"prompt": "x", "seed": 99999999999999999999999}',
        b'{"prompt": "x", "stop": 7}', b'{"prompt": "x", "stop": ["a","b","c","d","e"]}',
        b'{"prompt": "x", "logprobs": 99}', b'{"prompt": "x", "stream": "yes"}',
        b'{"prompt": [], "max_tokens": 2}', b'{"prompt": [-1]}', b'{"prompt": [1.5]}',
        b'{"prompt": [[1, 2]]}', b'{"prompt": ["a", "b"]}', b'{"prompt": {"a": 1}}',
        b'{"messages": []}', b'{"messages": "hi"}', b'{"messages": [{"role": "user"}]}',
        b'{"messages": [{"role": "user", "content": 5}]}', b'{"messages": [{"content": "x"}]}',
        b'{"messages": [{"role": "user", "content": [{"type": "image", "url": "x"}]}]}',
        b'{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}',
        b'{"messages": [{"role": "user", "content": "x"}], "logprobs": 3}',
        b'\xff\xfe{"prompt": "x"}', b'{"prompt": "\\ud800"}', b'{"prompt": "x"} trailing',
        b'{"prompt": "x", "prompt": 5}', b'{"response_id": 5, "signal": "accepted"}',
        b'{"response_id": "", "signal": "accepted"}', b'{"response_id": "a", "signal": "accepted", "index": -1}',
        b'{"response_id": "a", "signal": "scalar", "value": NaN}', b'{"response_id": "a"}']


def test_fuzzed_bodies_never_500(served):
    for body in FUZZ:
        for path in ("/v1/completions", "/v1/chat/completions", "/v1/feedback"):
            status, _, err = served.raw("POST", path, body)
            assert 400 <= status < 500, (path, body, status, err)
            assert isinstance(err, dict) and "message" in err["error"], (path, body, err)
    for method, path in [("GET", "/v1/nothing"), ("DELETE", "/v1/completions"), ("GET", "/v1/feedback")]:
        status, _, err = served.raw(method, path)
        assert 400 <= status < 500 and "error" in err
    status, _, _ = served.raw("POST", "/v1/completions", b'{"prompt": "x"}',
                              headers={"Content-Length": "abc"})
    assert 400 <= status < 500
