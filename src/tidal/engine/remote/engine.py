"""RemoteEngine: the Engine interface the harness drives (submit / step / generate / version /
load_weights), served by an OpenAI-compatible server instead of a local model.

    submit(req) ──> an HTTP request on this engine's event-loop thread (aiohttp), at most
                    engine.remote.max_in_flight open at once
    step()      ──> waits up to engine.remote.poll_s for finished requests, returns their
                    GenerationResults (tokens, sampling logprobs, versions, experts)
    load_weights(model | None, version) ──> the server's reload call (kinds.update_calls)

Every request carries the key in the environment variable engine.remote.api_key_env
(``Authorization: Bearer``; a tidal serve wants an admin key, for the reload call).
Every reply is checked: a version this engine loaded must come with the digest the update
reported; a version older than ``version - max_lag`` (the staleness bound) is refused and the
request sent again, up to engine.remote.retries times. Connection errors, timeouts and 5xx
answers are retried the same way; after that ``step()`` raises RemoteEngineError, the rollout
worker fails, and the orchestrator re-runs its assignment on a fresh worker. Nothing waits
without a timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import json
import os
import threading
from types import SimpleNamespace

import aiohttp

from tidal.engine.engine import check_prompt
from tidal.engine.remote import kinds
from tidal.engine.request import GenerationRequest, GenerationResult
from tidal.errors import UserError


class RemoteEngineError(UserError, RuntimeError):
    """The server is unreachable, failed, or answered with weights it must not use."""


class StaleReply(RemoteEngineError):
    """A reply from a version older than the staleness bound (sent again, then raised)."""


class _Retryable(Exception):
    pass


class RemoteEngine:
    """``cfg``: the EngineConfig (its ``remote`` section says where); ``tokenizer``: has decode and
    eos_id; ``model_config``: the served model's tidal ModelConfig (is_moe, layers, k);
    ``weights`` / ``transport``: where the training run publishes (the server pulls from there,
    kind tidal); ``max_lag``: the staleness bound (orchestrator.max_staleness);
    ``write_folder(model, version)``: writes a version where a vllm/sglang server reloads it;
    ``api_key``: the server's API key (None: the environment variable engine.remote.api_key_env
    names)."""

    def __init__(self, cfg, tokenizer, model_config, weights: str = "", transport: str = "http",
                 max_lag: int = 0, router_replay: str = "off", write_folder=None,
                 api_key: str | None = None):
        self.cfg, self.tokenizer, self.rcfg = cfg, tokenizer, cfg.remote
        if api_key is None:
            api_key = os.environ.get(cfg.remote.api_key_env, "")
        self._api_key = api_key
        self.kind, self.url = self.rcfg.kind, self.rcfg.url.rstrip("/")
        self.model = SimpleNamespace(config=model_config)
        self.is_moe = model_config.is_moe
        self.vocab_size = model_config.vocab_size
        self.weights, self.transport, self.max_lag = weights, transport, max_lag
        self.write_folder = write_folder
        self.needs_local_weights = self.kind != "tidal"
        """Whether load_weights needs the model itself (vllm/sglang: written to a folder)."""
        self.want_experts = self.is_moe and kinds.EXPERTS[self.kind]
        self.router_replay = router_replay
        if self.is_moe and router_replay == "required" and not kinds.EXPERTS[self.kind]:
            raise UserError(
                f"trainer.router_replay = 'required' needs the experts the engine routed each "
                f"token through, and a {self.kind} server (engine.remote.kind) does not report "
                "them; set trainer.router_replay = 'if_available' (or 'off'), or serve with "
                "tidal serve (engine.remote.kind = 'tidal')")
        self.supervisor = None
        """A launched server's VllmServer (engine.remote.launch): checked each step, stopped
        on close."""
        self._version = -1
        self._digests: dict[int, str | None] = {}
        self._futures: dict[int, cf.Future] = {}
        self._next_id = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="tidal-remote-engine")
        self._thread.start()
        self._session = self._call(self._open())
        try:
            self.probe()
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------- the Engine interface

    @property
    def version(self) -> int:
        """The version last loaded into the server by this engine (-1: none yet)."""
        return self._version

    @property
    def has_work(self) -> bool:
        return bool(self._futures)

    def submit(self, request: GenerationRequest) -> int:
        check_prompt(request.prompt_ids, self.cfg.max_seq_len, self.vocab_size)
        request_id = self._next_id
        self._next_id += 1
        self._futures[request_id] = asyncio.run_coroutine_threadsafe(
            self._complete(request_id, request), self._loop)
        return request_id

    def abort_all(self) -> int:
        """Forget every request in flight (a failed rollout's leftovers; their replies are
        dropped); returns how many."""
        dropped = len(self._futures)
        for future in self._futures.values():
            future.cancel()
        self._futures.clear()
        return dropped

    def step(self) -> list[GenerationResult]:
        """The requests that finished within engine.remote.poll_s (maybe none); raises the
        first failed request's RemoteEngineError."""
        if self.supervisor is not None and self.supervisor.failed:
            raise RemoteEngineError(f"the launched server at {self.url}: {self.supervisor.failed}")
        if not self._futures:
            return []
        done, _ = cf.wait(list(self._futures.values()), timeout=self.rcfg.poll_s,
                          return_when=cf.FIRST_COMPLETED)
        finished = []
        for rid in [rid for rid, f in self._futures.items() if f in done]:
            finished.append(self._futures.pop(rid).result())
        return finished

    def generate(self, requests: list[GenerationRequest], before_step=None) -> list[GenerationResult]:
        ids = [self.submit(r) for r in requests]
        done: dict[int, GenerationResult] = {}
        while len(done) < len(ids):
            if before_step is not None:
                before_step()
            done |= {r.request_id: r for r in self.step()}
        return [done[i] for i in ids]

    def progress(self, request_ids) -> dict:
        """Replies come whole (no streaming): nothing is known before a request finishes."""
        return {}

    def load_weights(self, weights, version: int) -> None:
        """Make the server serve ``version``: kind tidal pulls it from the run's transport
        itself (``weights`` unused, may be None); vllm/sglang get ``weights`` (a model) written
        to engine.remote.weights_dir first. Requests in flight finish on what they started."""
        if self.kind != "tidal":
            if weights is None or self.write_folder is None:
                raise RemoteEngineError(f"a {self.kind} server reloads from a folder: "
                                        "load_weights needs the model and a folder writer")
            self.write_folder(weights, version)
        digest = None
        for path, body in kinds.update_calls(self.kind, version, self.weights, self.transport,
                                             self.rcfg.weights_dir):
            answer = self._call(self._post(path, body, self.rcfg.update_timeout_s, "update"),
                                timeout=None)
            digest = kinds.check_update(self.kind, answer) or digest
        self._digests[version] = digest
        self._version = version

    def probe(self) -> dict:
        """GET the server's model list; a clear error naming the URL if nobody answers."""
        return self._call(self._get(kinds.probe_path(self.kind)))

    def close(self) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()
        if self._loop.is_closed():
            return
        self._call(self._session.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    # ---------------------------------------------------------------- on the loop thread

    async def _open(self) -> aiohttp.ClientSession:
        # requests wait for a turn here, not inside aiohttp's timeout
        self._slots = asyncio.Semaphore(self.rcfg.max_in_flight)
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else None
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self.rcfg.max_in_flight + 4),
                                     headers=headers)

    def _refused(self, what: str, status: int, text: str) -> RemoteEngineError:
        """A 4xx answer; a 401 / 403 says which key to give."""
        hint = ""
        if status in (401, 403):
            sent = "sent none" if not self._api_key else "sent one it did not accept"
            hint = (f" (this worker {sent}: set the environment variable "
                    f"{self.rcfg.api_key_env} (engine.remote.api_key_env) to a key of the server; "
                    "a tidal serve needs an admin key for weight updates)")
        return RemoteEngineError(f"the inference server at {self.url} (engine.remote.url) refused "
                                 f"{what} with HTTP {status}{hint}: {text[:300]}")

    def _call(self, coro, timeout: float | None = None):
        """Run ``coro`` on the loop thread and wait for it (each call bounds itself)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _timeout(self, total: float) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=total, sock_connect=self.rcfg.connect_timeout_s)

    async def _get(self, path: str):
        url = self.url + path
        try:
            async with self._session.get(url, timeout=self._timeout(self.rcfg.connect_timeout_s * 3)) as r:
                if r.status >= 400:
                    raise self._refused(f"GET {path}", r.status, await r.text())
                return await r.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            raise RemoteEngineError(
                f"cannot reach the inference server at {self.url} (engine.remote.url): "
                f"{type(e).__name__}: {e or 'timed out'}; start it (for kind {self.kind!r}) or "
                "fix the URL") from None

    async def _post(self, path: str, body: dict, total_s: float, what: str):
        """POST with retries on connection errors, timeouts and 5xx; 4xx is the caller's bug
        or a refusal and raises at once."""
        delay, errors = self.rcfg.retry_backoff_s, []
        for attempt in range(self.rcfg.retries + 1):
            if attempt:
                await asyncio.sleep(delay)
                delay *= 2
            try:
                async with self._slots:
                    return await self._post_once(path, body, total_s)
            except _Retryable as e:
                errors.append(str(e))
        raise RemoteEngineError(f"{what} at {self.url}{path} failed {self.rcfg.retries + 1} "
                                f"times (engine.remote.retries = {self.rcfg.retries}): "
                                + "; ".join(errors[-3:]))

    async def _post_once(self, path: str, body: dict, total_s: float):
        try:
            async with self._session.post(self.url + path, json=body,
                                          timeout=self._timeout(total_s)) as r:
                text = await r.text()
                if r.status >= 500:
                    raise _Retryable(f"HTTP {r.status}: {text[:300]}")
                if r.status >= 400:
                    raise self._refused(f"POST {path}", r.status, text)
                return json.loads(text) if text.strip() else None
        except TimeoutError:  # before OSError: TimeoutError is one
            raise _Retryable(f"no answer within {total_s:g} s") from None
        except (aiohttp.ClientError, OSError) as e:
            raise _Retryable(f"{type(e).__name__}: {e}") from None

    async def _complete(self, request_id: int, req: GenerationRequest) -> GenerationResult:
        sampling = kinds.resolve(req, self.cfg)
        path, body = kinds.generate_call(self.kind, req, sampling, self.rcfg.model,
                                         self.want_experts)
        for attempt in range(self.rcfg.retries + 1):
            version = self._version  # what this engine had loaded when it asked
            answer = await self._post(path, body, self.rcfg.request_timeout_s, "generation")
            try:
                reply = kinds.parse_reply(self.kind, answer, getattr(self.tokenizer, "eos_id", None))
            except kinds.ReplyError as e:
                raise RemoteEngineError(str(e)) from None
            try:
                return self._result(request_id, req, self._checked(reply, version))
            except StaleReply:
                if attempt == self.rcfg.retries:
                    raise

    def _checked(self, reply: kinds.Reply, asked_at: int) -> kinds.Reply:
        """The reply, its version and digest checked (see the module docstring)."""
        if reply.version is None:  # vllm / sglang: the version this engine had loaded
            reply.version = asked_at
        floor = self._version - self.max_lag
        if reply.version < floor:
            raise StaleReply(f"the inference server at {self.url} answered with version "
                             f"{reply.version}, older than the staleness bound allows (this "
                             f"worker holds {self._version}, orchestrator.max_staleness = "
                             f"{self.max_lag}); is another run updating it?")
        known = self._digests.get(reply.version)
        if reply.manifest_sha256 is not None and known is not None and known != reply.manifest_sha256:
            raise RemoteEngineError(
                f"the inference server at {self.url} answered with version {reply.version} "
                f"under digest {reply.manifest_sha256}, but that version's weights have digest "
                f"{known}: the server holds other weights under that number; serve this run "
                "from a fresh server")
        if reply.version not in self._digests:
            self._digests[reply.version] = reply.manifest_sha256
        return reply

    def _no_experts(self) -> list[list[int]]:
        """A token's entry for "no recorded routing" (as the harness writes for env tokens)."""
        mcfg = self.model.config
        return [[-1] * mcfg.num_experts_per_tok for _ in range(mcfg.num_hidden_layers)]

    def _result(self, request_id: int, req: GenerationRequest, reply: kinds.Reply) -> GenerationResult:
        n = len(reply.token_ids)
        if len(reply.logprobs) != n or n == 0:
            raise RemoteEngineError(f"the inference server at {self.url} answered {n} tokens with "
                                    f"{len(reply.logprobs)} logprobs")
        experts, prompt_experts = reply.experts, reply.prompt_experts
        if self.is_moe and experts is None:
            if self.router_replay == "required":
                raise RemoteEngineError(
                    f"the inference server at {self.url} answered without expert ids for an MoE "
                    "model, which trainer.router_replay = 'required' needs; serve with a tidal "
                    "serve that reports them, or set trainer.router_replay = 'if_available'")
            experts, prompt_experts = [self._no_experts()] * n, None
        if not self.is_moe:
            experts = prompt_experts = None
        return GenerationResult(
            request_id=request_id, prompt_ids=list(req.prompt_ids), token_ids=list(reply.token_ids),
            logprobs=[float(x) for x in reply.logprobs],
            versions=list(reply.versions) if reply.versions else [reply.version] * n,
            experts=experts, prompt_experts=prompt_experts, finish_reason=reply.finish_reason,
            text=self.tokenizer.decode(reply.token_ids), tag=req.tag)
