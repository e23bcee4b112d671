"""The OpenAI-compatible HTTP API (FastAPI): completions, chat, models, feedback, status.

    POST /v1/completions, /v1/chat/completions   (stream: server-sent events, then [DONE]; chat
                                                 takes OpenAI's tools: chat/tool_calls.py)
    GET  /v1/models, /v1/models/{id}             the served model; its live version and sha
    POST /v1/feedback                            {"response_id", "index", "signal", "value"}
    GET  /v1/tidal/status                        routes, per-version counts and latency, refusals,
                                                 tool-call counts (tools.ToolStats)
    POST /v1/tidal/update_weights                {"version", "weights", "transport"}: load a
                                                 training run's version and serve it live
                                                 (rollout workers; online/update.py; admin)
    /v1/tidal/versions..., /v1/tidal/keys...     admin: the registry and ephemeral keys (admin.py)

Every request needs an API key (``Authorization: Bearer``; auth.py), checked from the headers
before its body is read: 401 without a valid one, 403 where an admin key is needed or the
feedback is for a response another key received.

Bodies are read by hand (at most the size limit, counted while reading), then validated by the
strict pydantic models of schemas.py, so every client mistake is one OpenAI-style 4xx body
naming its field (errors.py). Each choice is recorded through ``recorder.record`` before the
response (or, streaming, its last chunks) goes out, so feedback can refer to it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from tidal.chat import tool_calls as tools
from tidal.online.api import render
from tidal.online.api.bodies import parse, read_body
from tidal.online.api.auth import KeyRing, OwnedRecorder, RequireKey, admin_only, principal_of
from tidal.chat.template import END_OF_TURN, ChatTemplate, ChatTemplateError
from tidal.online.api.errors import (
    ApiError,
    error_response,
    retry_header,
)
from tidal.online.api.schemas import (
    ChatRequest,
    CompletionRequest,
    FeedbackRequest,
    UpdateWeightsRequest,
)
from tidal.online.config import OnlineConfig
from tidal.online.records import FeedbackEvent
from tidal.online.serving import NotServing, PromptError, Sampling


def create_app(cfg: OnlineConfig, policy, recorder, feedback, live_versions=None,
               updater=None, *, keys: KeyRing | None, registry=None) -> FastAPI:
    """The API over ``policy`` (a PolicyServer); ``recorder.record(list[ServedResponse])`` and
    ``feedback.submit(FeedbackEvent)`` / ``feedback.retry_after()`` are the store's. With
    ``live_versions`` (-> the registry's VersionRecords), the app polls it every
    ``cfg.serve.poll_s`` and serves what it lists (PolicyServer.refresh). ``updater``: a
    tidal.online.update.WeightUpdater behind POST /v1/tidal/update_weights (None: 404).
    ``keys``: the API keys every request must present; None serves everyone (``--no-auth``,
    which ``tidal serve`` allows on a loopback host only: auth.serving_keys). ``registry``: a
    VersionRegistry behind the admin routes /v1/tidal/versions (None: 404)."""
    from tidal.online.api.admin import add_admin_routes

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        policy.start()
        poll = None
        if live_versions is not None:
            poll = asyncio.create_task(policy.poll(live_versions, cfg.serve.poll_s))
        try:
            yield
        finally:
            if poll is not None:
                poll.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await poll
            policy.stop()

    app = FastAPI(title="tidal", lifespan=lifespan, docs_url=None, redoc_url=None)
    api = _Api(cfg, policy, OwnedRecorder(recorder), feedback, updater)
    app.add_api_route("/v1/models", api.models, methods=["GET"])
    app.add_api_route("/v1/models/{model_id}", api.model, methods=["GET"])
    app.add_api_route("/v1/completions", api.completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", api.chat, methods=["POST"])
    app.add_api_route("/v1/feedback", api.feedback, methods=["POST"])
    app.add_api_route("/v1/tidal/status", api.status, methods=["GET"])
    if updater is not None:
        app.add_api_route("/v1/tidal/update_weights", api.update_weights, methods=["POST"],
                          dependencies=[Depends(admin_only)])
    add_admin_routes(app, policy, registry, live_versions, keys)
    app.add_middleware(RequireKey, keys=keys)
    _handlers(app)
    app.state.api, app.state.keys = api, keys
    return app


def _handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_request, exc: ApiError):
        return exc.response()

    @app.exception_handler(HTTPException)
    async def _http(_request, exc: HTTPException):
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        return error_response(exc.status_code, str(exc.detail), kind, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request, exc: RequestValidationError):
        return error_response(400, str(exc.errors()[0].get("msg", "invalid request")))

    @app.exception_handler(Exception)
    async def _bug(_request, exc: Exception):  # never for client input: that is ApiError
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")


def chat_request(req: ChatRequest) -> tuple[tools.ToolUse | None, list[dict]]:
    """A chat request's function calling (None without tools) and its messages as templates take
    them (tools.template_messages); a 400 naming the field for tools or tool messages that
    cannot be served."""
    try:
        use = tools.ToolUse.of(**req.model_dump(
            include={"tools", "tool_choice", "parallel_tool_calls"}, exclude_none=True))
        messages = tools.template_messages([m.model_dump(exclude_none=True) for m in req.messages])
    except tools.ToolRequestError as e:
        code = "invalid_messages" if e.param.startswith("messages") else "invalid_tools"
        raise ApiError(400, str(e), param=e.param, code=code) from None
    return use, messages


class _Api:
    """The route handlers (one instance per app)."""

    def __init__(self, cfg: OnlineConfig, policy, recorder, feedback, updater=None):
        self.cfg, self.policy, self.recorder, self.feedback_sink = cfg, policy, recorder, feedback
        self.updater = updater
        self.tokenizer = policy.tokenizer
        self.template: ChatTemplate = policy.chat or ChatTemplate()
        self.tool_stats = tools.ToolStats()

    # ---------------------------------------------------------------- models, status

    def _model_card(self) -> dict:
        status = self.policy.status()
        live = status["live"]
        sha = self.policy.sha_of(live) if live is not None else None
        return {"id": self.cfg.serve.model_name, "object": "model", "created": 0, "owned_by": "tidal",
                "tidal_version": live, "tidal_manifest_sha256": sha,
                "tidal_canary": status["canary"], "tidal_errors": status["errors"][-5:]}

    async def models(self):
        return {"object": "list", "data": [self._model_card()]}

    async def model(self, model_id: str):
        if model_id != self.cfg.serve.model_name:
            raise self._unknown_model(model_id)
        return self._model_card()

    async def status(self):
        return {**self.policy.status(), **self.tool_stats.status()}

    async def update_weights(self, request: Request):
        req = parse(UpdateWeightsRequest, await read_body(request, self.cfg.serve.max_body_bytes))
        from tidal.online.update import UpdateConflict

        try:
            version, sha = await asyncio.to_thread(self.updater.update, req.version, req.weights,
                                                   req.transport)
        except UpdateConflict as e:
            raise ApiError(409, str(e), param="version", code="version_conflict") from None
        except Exception as e:  # the weights could not be fetched or verified: the old keep serving
            raise ApiError(502, f"loading version {req.version} from {req.weights} failed: "
                                f"{type(e).__name__}: {e}", "server_error",
                           code="update_failed") from None
        return {"version": version, "manifest_sha256": sha}

    def _unknown_model(self, name: str) -> ApiError:
        return ApiError(404, f"model {name!r} does not exist; this server serves "
                             f"{self.cfg.serve.model_name!r}", param="model", code="model_not_found")

    # ---------------------------------------------------------------- generation

    async def completions(self, request: Request):
        req = parse(CompletionRequest, await read_body(request, self.cfg.serve.max_body_bytes))
        if req.return_token_ids and (req.stream or req.n != 1):
            raise ApiError(400, "return_token_ids needs stream: false and n: 1",
                           param="return_token_ids")
        if req.tidal_return_experts and not req.return_token_ids:
            raise ApiError(400, "tidal_return_experts needs return_token_ids: true",
                           param="tidal_return_experts")
        if isinstance(req.prompt, str):
            # BOS first, as the harness encodes every environment prompt (tidal's models are
            # trained that way); a token-list prompt is used exactly as given.
            prompt_ids = self.tokenizer.encode(req.prompt, add_bos=True)
        else:
            prompt_ids = list(req.prompt)
        top = req.logprobs
        return await self._generate(req, prompt_ids, "completions", "prompt", req.max_tokens, top)

    async def chat(self, request: Request):
        req = parse(ChatRequest, await read_body(request, self.cfg.serve.max_body_bytes))
        use, messages = chat_request(req)
        try:
            prompt = self.template.render(messages, use.tools if use else None)
        except ChatTemplateError as e:
            raise ApiError(400, str(e), param="messages", code="invalid_messages") from None
        top = (req.top_logprobs or 0) if req.logprobs else None
        if req.top_logprobs is not None and not req.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        max_tokens = req.max_completion_tokens or req.max_tokens
        # A checkpoint's own template writes its BOS itself; the plain one gets tidal's BOS.
        ids = self.tokenizer.encode(prompt, add_bos=self.template.kind == "plain")
        return await self._generate(req, ids, "chat", "messages", max_tokens, top, use)

    def _sampling(self, req, max_tokens: int | None, chat: bool = False) -> Sampling:
        serve = self.cfg.serve
        if req.model is not None and req.model != serve.model_name:
            raise self._unknown_model(req.model)
        if max_tokens is not None and max_tokens > serve.max_tokens:
            raise ApiError(400, f"max_tokens is {max_tokens} but this server allows at most "
                                f"{serve.max_tokens} (online.serve.max_tokens)", param="max_tokens")
        if req.n > serve.max_n:
            raise ApiError(400, f"n is {req.n} but this server allows at most {serve.max_n} "
                                "(online.serve.max_n)", param="n")
        stop = [req.stop] if isinstance(req.stop, str) else req.stop
        if stop is None:
            stop = list(self.policy.engine_cfg.stop)
            if chat and self.template.kind == "plain":  # the plain template's end of a reply
                stop.append(END_OF_TURN)
        return Sampling(max_tokens or serve.max_tokens, req.temperature, req.top_p, stop, req.seed,
                        req.ignore_eos)

    async def _generate(self, req, prompt_ids, endpoint: str, prompt_field: str,
                        max_tokens: int | None, top: int | None,
                        use: tools.ToolUse | None = None):
        sampling = self._sampling(req, max_tokens, endpoint == "chat")
        try:
            gen = await self.policy.generate(prompt_ids, sampling, req.n, stream=req.stream)
        except PromptError as e:
            code = "context_length_exceeded" if "at most" in str(e) else "invalid_prompt"
            raise ApiError(400, str(e), param=prompt_field, code=code) from None
        except NotServing as e:
            raise ApiError(503, str(e), "server_error", code="not_serving") from None
        prefix = "cmpl" if endpoint == "completions" else "chatcmpl"
        call = _Call(self, req, endpoint, f"{prefix}-{uuid.uuid4().hex}", gen, sampling, top, use)
        headers = {"X-Tidal-Version": str(gen.version), "X-Tidal-Manifest-Sha256": gen.manifest_sha256}
        if req.stream:
            return StreamingResponse(call.stream(), media_type="text/event-stream",
                                     headers={**headers, "Cache-Control": "no-cache"})
        return JSONResponse(await call.complete(), headers=headers)

    # ---------------------------------------------------------------- feedback

    async def feedback(self, request: Request):
        req = parse(FeedbackRequest, await read_body(request, self.cfg.serve.max_feedback_bytes))
        if req.signal == "scalar" and req.value is None:
            raise ApiError(400, 'signal "scalar" needs a value in [-1, 1]', param="value")
        if req.signal != "scalar" and req.value is not None:
            raise ApiError(400, f'value is only for signal "scalar", not {req.signal!r}', param="value")
        retry = self.feedback_sink.retry_after()
        if retry is not None:
            raise ApiError(429, "the learner is behind the served traffic; retry later",
                           "rate_limit_error", code="learner_behind", headers=retry_header(retry))
        sender = principal_of(request)
        event = FeedbackEvent(response_id=req.response_id, signal=req.signal, index=req.index,
                              value=req.value, received=time.time(),
                              key_id=sender.key_id if sender is not None else None)
        outcome = await self.feedback_sink.submit(event)
        if outcome == "unknown_response":
            raise ApiError(404, f"no response {req.response_id!r} with choice {req.index} was "
                                "served here", param="response_id", code="unknown_response")
        if outcome == "not_owner":
            raise ApiError(403, "feedback on a response is taken only from the API key it was "
                                "served to", param="response_id", code="not_owner")
        if outcome == "duplicate":
            raise ApiError(409, f"feedback for {req.response_id!r} choice {req.index} was already "
                                "stored", param="response_id", code="duplicate")
        return {"id": req.response_id, "index": req.index, "status": "stored"}


class _Call:
    """One generation request being answered: the full body, or its stream of chunks. With
    ``use`` (a chat request's tools), each choice's text is read for tool calls (chat/tool_calls.py):
    a reply with calls finishes "tool_calls" (also in its record, whose text and token ids stay
    what the policy sampled)."""

    def __init__(self, api: _Api, req, endpoint: str, response_id: str, gen, sampling: Sampling,
                 top: int | None, use: tools.ToolUse | None = None):
        self.api, self.req, self.endpoint, self.id, self.gen = api, req, endpoint, response_id, gen
        self.tools = use
        self.stop, self.top = sampling.stop, top
        self.temperature = (sampling.temperature if sampling.temperature is not None
                            else api.policy.engine_cfg.temperature)
        self.created = int(time.time())
        self.chat = endpoint == "chat"

    def _envelope(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created,
                "model": self.api.cfg.serve.model_name, "tidal_version": self.gen.version,
                "tidal_manifest_sha256": self.gen.manifest_sha256}

    def _logprobs(self, ids: list[int], logprobs: list[float], offset: int = 0):
        if self.top is None:
            return None
        tok = self.api.tokenizer
        if self.chat:
            return render.chat_logprobs(tok, ids, logprobs, self.top)
        return render.completion_logprobs(tok, ids, logprobs, offset)

    async def _record(self, results, texts) -> None:
        rows = render.served(self.id, self.endpoint, self.gen, results, texts, self.temperature)
        await self.api.recorder.record(rows)

    def _replies(self, texts: list[tuple[str, str]]) -> tuple[list, list[tuple[str, str]]]:
        """Each choice's parsed reply (None without tools, counted in the server's ToolStats),
        and its (text, finish_reason) with "tool_calls" where calls came."""
        if self.tools is None:
            return [None] * len(texts), texts
        replies = [self.tools.reply(text) for text, _ in texts]
        for reply in replies:
            self.api.tool_stats.count(reply)
        return replies, [(text, "tool_calls" if reply.calls else finish)
                         for (text, finish), reply in zip(texts, replies)]

    async def complete(self) -> dict:
        results = await self.gen.results()
        replies, texts = self._replies([render.final_text(r, self.stop) for r in results])
        await self._record_or_503(results, texts)
        tok = self.api.tokenizer
        choices = []
        for i, (r, (text, finish)) in enumerate(zip(results, texts)):
            k = render.kept_tokens(tok, r.token_ids, text)
            lp = self._logprobs(r.token_ids[:k], r.logprobs[:k])
            if self.chat:
                message = (replies[i].message if replies[i] is not None
                           else {"role": "assistant", "content": text})
                choices.append({"index": i, "message": message, "logprobs": lp,
                                "finish_reason": finish})
            else:
                choices.append({"index": i, "text": text, "logprobs": lp, "finish_reason": finish,
                                **self._token_fields(r)})
        obj = "chat.completion" if self.chat else "text_completion"
        return {**self._envelope(obj), "choices": choices,
                "usage": render.usage(results[0].prompt_ids, results)}

    def _token_fields(self, r) -> dict:
        """return_token_ids: every sampled token and what a rollout worker records of it."""
        if not getattr(self.req, "return_token_ids", False):
            return {}
        out = {"prompt_token_ids": r.prompt_ids, "token_ids": r.token_ids,
               "tidal_logprobs": r.logprobs, "tidal_versions": r.versions,
               "tidal_finish_reason": r.finish_reason}
        if self.req.tidal_return_experts:
            out |= {"tidal_experts": r.experts, "tidal_prompt_experts": r.prompt_experts}
        return out

    async def _record_or_503(self, results, texts) -> None:
        try:
            await self._record(results, texts)
        except Exception as e:  # the store is down: the client may retry; nothing was returned
            raise ApiError(503, f"the response could not be recorded ({type(e).__name__}: {e}); "
                                "retry", "server_error", code="store_unavailable") from None

    def _chunk(self, index: int, text: str, lp, finish: str | None, first: bool) -> bytes:
        if self.chat:
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            if finish is not None and not text:
                delta = {}
            choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}
            return render.sse({**self._envelope("chat.completion.chunk"), "choices": [choice]})
        choice = {"index": index, "text": text, "logprobs": lp, "finish_reason": finish}
        return render.sse({**self._envelope("text_completion"), "choices": [choice]})

    def _call_chunks(self, index: int, calls: list[tools.ToolCall]) -> list[bytes]:
        """Each call as the deltas OpenAI streams (tools.call_deltas)."""
        return [render.sse({**self._envelope("chat.completion.chunk"), "choices": [
                    {"index": index, "delta": {"tool_calls": [delta]}, "logprobs": None,
                     "finish_reason": None}]}) for delta in tools.call_deltas(calls)]

    async def stream(self):
        """Chunks as tokens arrive; the choices' last chunks (finish_reason) only after every
        choice is recorded, then [DONE]."""
        n = len(self.gen.futures)
        texts = [render.StreamText(self.api.tokenizer, self.stop) for _ in range(n)]
        held = [tools.ToolStream() if self.tools is not None and self.tools.parses else None
                for _ in range(n)]
        first = [True] * n
        results: list = [None] * n
        try:
            async for event in self.gen.events():
                new = texts[event.index].add(event.token_ids)
                if held[event.index] is not None:  # a tool call may be starting: hold it back
                    new = held[event.index].add(new)
                if event.result is not None:
                    results[event.index] = event.result
                if new or first[event.index]:
                    lp = self._logprobs(event.token_ids, event.logprobs)
                    yield self._chunk(event.index, new, lp, None, first[event.index])
                    first[event.index] = False
        except Exception as e:
            yield render.sse({"error": {"message": str(e), "type": "server_error", "param": None,
                                        "code": None}})
            return
        replies, finals = self._replies([render.final_text(r, self.stop) for r in results])
        try:
            await self._record(results, finals)
        except Exception as e:
            yield render.sse({"error": {"message": f"the response could not be recorded: {e}",
                                        "type": "server_error", "param": None,
                                        "code": "store_unavailable"}})
            return
        for i, (text, finish) in enumerate(finals):
            if held[i] is None:
                yield self._chunk(i, texts[i].finish(text), None, finish, False)
                continue
            rest = held[i].finish(text, replies[i])
            if rest:
                yield self._chunk(i, rest, None, None, False)
            for chunk in self._call_chunks(i, replies[i].calls):
                yield chunk
            yield self._chunk(i, "", None, finish, False)
        yield render.DONE
