"""The gateway's OpenAI-compatible endpoint: one server on 127.0.0.1 per rollout call, on the
rollout's own event loop, so a harness's requests join the engine's continuous batching with
every other episode's.

    POST /v1/chat/completions   (the episode's key)  served by the rollout engine, at its current
                                                     version, sampled at the run's temperature
    GET  /v1/models
    POST /v1/tidal/answer       {"answer": str}      the episode's final answer (reward = "grade")
    POST /v1/tidal/reward       {"reward", "reason"} the harness's own reward (reward = "harness")

Each episode has its own bearer key, valid from its start to its end only; a request with any
other key is a 401. A request past the episode's turn or token budget, or whose prompt does not
fit the context, ends the episode (the harness gets a 4xx with the reason and is stopped).
The harness's sampling settings (temperature, top_p, seed) are ignored: the trainer recomputes
each token's logprob at the run's temperature, so the engine must sample at it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import Field
from starlette.exceptions import HTTPException

from tidal.gateway.config import GatewayConfig
from tidal.harness.history import History
from tidal.chat.render import Renderer
from tidal.harness.turn import ContextFull, TemplateRejected, take_turn
from tidal.harness.seeds import derive_seed
from tidal.online.api.app import chat_request
from tidal.online.api.bodies import parse, read_body
from tidal.online.api.auth import KeyRing, key_id
from tidal.online.api.errors import ApiError, error_response
from tidal.online.api.render import DONE, sse
from tidal.online.api.schemas import Body, ChatRequest
from tidal.chat.tool_calls import ToolCall, call_deltas


class AnswerRequest(Body):
    answer: str = Field(max_length=1 << 20)


class RewardRequest(Body):
    reward: float
    reason: str = Field("reward_posted", min_length=1, max_length=128)


@dataclass
class Channel:
    """One running episode as the gateway sees it."""

    key: str
    index: int
    seed: int | None
    history: History
    turns: int = 0
    model_tokens: int = 0
    answer: str | None = None
    reward: tuple[float, str] | None = None
    ended: str | None = None
    """Why the gateway ended the episode (a budget, an answer, a reward), or None."""
    done: asyncio.Event = field(default_factory=asyncio.Event)
    malformed_calls: int = 0
    overhead_ms: list[float] = field(default_factory=list)
    """Per turn: the request's time in the gateway minus its time in the engine."""

    def end(self, reason: str) -> None:
        if self.ended is None:
            self.ended = reason
        self.done.set()


class Gateway:
    """The server of one rollout call. ``client``: async generate(GenerationRequest) (the
    rollout's EngineClient); ``window``: the context window in tokens."""

    def __init__(self, client, tokenizer, engine_cfg, cfg: GatewayConfig, window: int,
                 no_experts=None):
        self.client, self.tok, self.engine_cfg, self.cfg = client, tokenizer, engine_cfg, cfg
        self.window, self.no_experts = window, no_experts
        self.renderer = Renderer(tokenizer)
        self.keys = KeyRing()
        """Each open episode's key (issued at open, revoked at close)."""
        self.channels: dict[str, Channel] = {}
        """Open episodes by their key's key_id."""
        self.app = self._app()
        self._server = None
        self._task: asyncio.Task | None = None
        self.base_url = ""

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> "Gateway":
        import uvicorn

        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning",
                                lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None  # the run's own handlers stay
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("the gateway's server stopped while starting")
            await asyncio.sleep(0.005)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        return self

    async def __aexit__(self, *exc) -> None:
        """Stop serving at once: every episode has ended, so no response is awaited. A request
        still in the engine when its episode ended (a harness stopped at its timeout) would
        otherwise hold uvicorn's graceful shutdown forever: the engine stops with the rollout."""
        if self._server is not None:
            self._server.should_exit = True
            self._server.force_exit = True
            with contextlib.suppress(Exception):
                await self._task

    def open(self, index: int, seed: int | None) -> Channel:
        """A new episode's channel and key."""
        r = self.renderer
        history = History(r.render, r.encode, r.ends_turn, r.end_of_turn_text, self.no_experts)
        channel = Channel(self.keys.issue(f"episode-{index}", None), index, seed, history)
        self.channels[key_id(channel.key)] = channel
        return channel

    def close(self, channel: Channel) -> None:
        """The episode is over: its key stops working."""
        self.keys.revoke(channel.key)
        self.channels.pop(key_id(channel.key), None)
        channel.done.set()

    # ------------------------------------------------------------------ the app

    def _app(self) -> FastAPI:
        app = FastAPI(title="tidal gateway", docs_url=None, redoc_url=None, openapi_url=None)
        app.add_api_route("/v1/models", self.models, methods=["GET"])
        app.add_api_route("/v1/chat/completions", self.chat, methods=["POST"])
        app.add_api_route("/v1/tidal/answer", self.answer, methods=["POST"])
        app.add_api_route("/v1/tidal/reward", self.reward, methods=["POST"])

        @app.exception_handler(ApiError)
        async def _api_error(_request, exc: ApiError):
            return exc.response()

        @app.exception_handler(HTTPException)
        async def _http(_request, exc: HTTPException):
            return error_response(exc.status_code, str(exc.detail))

        return app

    def _channel(self, request: Request) -> Channel:
        """The episode of the request's key (a 401 for any other key: keys die with their
        episode)."""
        channel = self.channels[self.keys.authenticate(request.headers.get("authorization")).key_id]
        if channel.ended is not None:
            raise ApiError(409, f"this episode has ended ({channel.ended})", code="episode_ended")
        return channel

    async def models(self, request: Request):
        self._channel(request)
        return {"object": "list", "data": [{"id": "tidal", "object": "model", "created": 0,
                                            "owned_by": "tidal"}]}

    async def answer(self, request: Request):
        channel, req = await self._final(request, "grade", AnswerRequest)
        channel.answer = req.answer
        channel.end("answered")
        return {"status": "stored"}

    async def reward(self, request: Request):
        channel, req = await self._final(request, "harness", RewardRequest)
        if not math.isfinite(req.reward):
            raise ApiError(400, "reward must be a finite number", param="reward")
        channel.reward = (req.reward, req.reason)
        channel.end("reward_posted")
        return {"status": "stored"}

    async def _final(self, request: Request, mode: str, body: type):
        """(channel, body) of an episode's last word, which only the run's env.args.reward
        ``mode`` takes."""
        channel = self._channel(request)
        if self.cfg.reward != mode:
            other = {"grade": "/v1/tidal/answer", "harness": "/v1/tidal/reward"}[self.cfg.reward]
            raise ApiError(400, f"this run has env.args.reward = {self.cfg.reward!r}: post to "
                                f"{other}", code="wrong_endpoint")
        return channel, parse(body, await read_body(request, self.cfg.max_body_bytes))

    async def chat(self, request: Request):
        start = time.perf_counter()
        channel = self._channel(request)
        req = parse(ChatRequest, await read_body(request, self.cfg.max_body_bytes))
        if req.n != 1:
            raise ApiError(400, "the gateway samples one choice per request (n = 1)", param="n")
        use, messages = chat_request(req)
        tools = use.tools if use else None
        max_new = self._budget(channel, req)
        seed = None if channel.seed is None else derive_seed(channel.seed, channel.turns)
        try:
            turn = await take_turn(self.client, self.renderer, channel.history, messages, tools,
                                   use, max_new, self.window, seed, (channel.index, "turn"))
        except TemplateRejected as e:
            raise ApiError(400, str(e), param="messages", code="invalid_messages") from None
        except ContextFull as e:
            channel.end("context")
            raise ApiError(400, str(e), param="messages", code="context_length_exceeded") from None
        channel.turns += 1
        channel.model_tokens += len(turn.result.token_ids)
        channel.malformed_calls += turn.reply.malformed is not None
        body = self._completion(turn.reply.message, turn.finish, turn.placement.prompt_ids,
                                turn.result)
        channel.overhead_ms.append((time.perf_counter() - start - turn.engine_s) * 1000)
        if req.stream:
            return StreamingResponse(_stream(body, turn.reply.calls), media_type="text/event-stream")
        return JSONResponse(body)

    def _budget(self, channel: Channel, req: ChatRequest) -> int:
        """The turn's token limit; a request past a budget ends the episode."""
        if channel.turns >= self.cfg.max_turns:
            channel.end("turn_budget")
            raise ApiError(429, f"the episode's turn budget ({self.cfg.max_turns} requests) is "
                                "spent", "rate_limit_error", code="turn_budget")
        left = self.cfg.max_tokens - channel.model_tokens
        if left <= 0:
            channel.end("token_budget")
            raise ApiError(429, f"the episode's token budget ({self.cfg.max_tokens}) is spent",
                           "rate_limit_error", code="token_budget")
        asked = req.max_completion_tokens or req.max_tokens or self.engine_cfg.max_new_tokens
        return min(asked, left)

    def _completion(self, message: dict, finish: str, prompt_ids, result) -> dict:
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                "created": int(time.time()), "model": "tidal",
                "choices": [{"index": 0, "message": message, "logprobs": None,
                             "finish_reason": finish}],
                "usage": {"prompt_tokens": len(prompt_ids),
                          "completion_tokens": len(result.token_ids),
                          "total_tokens": len(prompt_ids) + len(result.token_ids)}}


async def _stream(body: dict, calls: list[ToolCall]):
    """A finished completion as OpenAI's stream chunks (role and content, the tool-call deltas,
    the finish), which the official client accumulates into the same message."""

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        return sse({"id": body["id"], "object": "chat.completion.chunk", "created": body["created"],
                    "model": body["model"], "choices": [
                        {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]})

    choice = body["choices"][0]
    yield chunk({"role": "assistant", "content": choice["message"].get("content") or ""})
    for delta in call_deltas(calls):
        yield chunk({"tool_calls": [delta]})
    yield chunk({}, choice["finish_reason"])
    yield DONE
