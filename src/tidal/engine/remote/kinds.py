"""What each kind of server is asked and answers: one request body per GenerationRequest, one
``Reply`` per answer, and the weight-reload call.

    tidal   POST /v1/completions {prompt: [ids], return_token_ids, tidal_return_experts}
            -> choices[0].token_ids, tidal_logprobs, tidal_versions, tidal_finish_reason,
               tidal_experts / tidal_prompt_experts; tidal_version, tidal_manifest_sha256
            reload: POST /v1/tidal/update_weights {version, weights, transport}
    vllm    POST /v1/completions {prompt: [ids], logprobs: 1, return_token_ids,
            include_stop_str_in_output} -> choices[0].token_ids, logprobs.token_logprobs,
            finish_reason + stop_reason (None = eos)
            reload: POST /collective_rpc {"method": "reload_weights"} (VLLM_SERVER_DEV_MODE=1:
            the model is read again from the folder it was started on), POST /reset_prefix_cache
    sglang  POST /generate {input_ids, sampling_params, return_logprob}
            -> meta_info.output_token_logprobs [[logprob, id, _]...], meta_info.finish_reason
            reload: POST /update_weights_from_disk {model_path, weight_version}

vLLM must run with ``--logprobs-mode processed_logprobs`` so its logprobs are of the distribution
sampled (temperature applied), tidal's convention (tidal.engine.sampling) for top_p = 1. Neither
vLLM nor SGLang reports a manifest digest or tidal's per-token versions: their replies carry the
version this worker last loaded into them, and no expert ids.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidal.engine.request import FinishReason, GenerationRequest

EXPERTS = {"tidal": True, "vllm": False, "sglang": False}
"""Whether a kind of server reports the MoE experts it routed each token through."""


class ReplyError(ValueError):
    """The server's answer lacks what a rollout needs (wrong kind, an old server)."""


@dataclass
class Sampling:
    """A request's settings with the engine defaults filled in (the server must not pick)."""

    max_new_tokens: int
    temperature: float
    top_p: float
    stop: list[str]
    seed: int | None
    ignore_eos: bool


@dataclass
class Reply:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    version: int | None
    """The version the server says produced it (None: the server does not say)."""
    manifest_sha256: str | None
    versions: list[int] | None = None
    experts: list | None = None
    prompt_experts: list | None = None


def resolve(req: GenerationRequest, cfg) -> Sampling:
    """``req``'s settings, None fields taken from the EngineConfig ``cfg``."""
    return Sampling(
        req.max_new_tokens if req.max_new_tokens is not None else cfg.max_new_tokens,
        req.temperature if req.temperature is not None else cfg.temperature,
        req.top_p if req.top_p is not None else cfg.top_p,
        list(req.stop) if req.stop is not None else list(cfg.stop),
        req.seed, req.ignore_eos)


def generate_call(kind: str, req: GenerationRequest, s: Sampling, model: str,
                  experts: bool) -> tuple[str, dict]:
    """(path, JSON body) of one generation request."""
    if kind == "sglang":
        params = {"max_new_tokens": s.max_new_tokens, "temperature": s.temperature,
                  "top_p": s.top_p, "stop": s.stop, "ignore_eos": s.ignore_eos,
                  "no_stop_trim": True, "skip_special_tokens": False}
        return "/generate", {"input_ids": list(req.prompt_ids), "sampling_params": params,
                             "return_logprob": True}
    body = {"prompt": list(req.prompt_ids), "max_tokens": s.max_new_tokens,
            "temperature": s.temperature, "top_p": s.top_p, "stop": s.stop,
            "ignore_eos": s.ignore_eos, "return_token_ids": True}
    if model:
        body["model"] = model
    if s.seed is not None:
        body["seed"] = s.seed
    if kind == "tidal":
        body["tidal_return_experts"] = experts
    else:  # vllm
        body |= {"logprobs": 1, "include_stop_str_in_output": True, "skip_special_tokens": False}
    return "/v1/completions", body


def parse_reply(kind: str, body: dict, eos_id: int | None) -> Reply:
    """The answer of ``generate_call``; ReplyError if a field a rollout needs is missing."""
    try:
        if kind == "tidal":
            return _tidal(body)
        if kind == "vllm":
            return _vllm(body, eos_id)
        return _sglang(body, eos_id)
    except (KeyError, IndexError, TypeError) as e:
        raise ReplyError(f"a {kind} server's answer lacks {e!r} (is engine.remote.kind right, "
                         f"and the server recent enough?): {str(body)[:300]}") from None


def _tidal(body: dict) -> Reply:
    c = body["choices"][0]
    return Reply(c["token_ids"], c["tidal_logprobs"], c["tidal_finish_reason"],
                 body["tidal_version"], body["tidal_manifest_sha256"], c["tidal_versions"],
                 c.get("tidal_experts"), c.get("tidal_prompt_experts"))


def _vllm(body: dict, eos_id: int | None) -> Reply:
    c = body["choices"][0]
    tokens, logprobs = c["token_ids"], c["logprobs"]["token_logprobs"]
    finish = "length" if c["finish_reason"] == "length" else (
        "stop" if isinstance(c.get("stop_reason"), str) else "eos")
    if finish == "eos" and tokens and eos_id is not None and tokens[-1] != eos_id:
        finish = "stop"  # a stop token id other than eos
    return Reply(tokens, [float(x) for x in logprobs], finish, None, None)


def _sglang(body: dict, eos_id: int | None) -> Reply:
    meta = body["meta_info"]
    rows = meta["output_token_logprobs"]
    tokens, logprobs = [int(r[1]) for r in rows], [float(r[0]) for r in rows]
    reason = meta["finish_reason"] or {}
    if reason.get("type") == "length":
        finish = "length"
    else:
        finish = "stop" if isinstance(reason.get("matched"), str) else "eos"
    version = meta.get("weight_version")
    return Reply(tokens, logprobs, finish,
                 int(version) if isinstance(version, str) and version.isdigit() else None, None)


def update_calls(kind: str, version: int, weights: str, transport: str,
                 folder: str) -> list[tuple[str, dict]]:
    """(path, JSON body) of the calls that make the server load ``version``: tidal pulls it
    from ``weights`` itself; vllm and sglang read it from ``folder`` (written beforehand)."""
    if kind == "tidal":
        return [("/v1/tidal/update_weights",
                 {"version": version, "weights": weights, "transport": transport})]
    if kind == "vllm":
        return [("/collective_rpc", {"method": "reload_weights"}), ("/reset_prefix_cache", {})]
    return [("/update_weights_from_disk", {"model_path": folder, "weight_version": str(version)})]


def check_update(kind: str, body) -> str | None:
    """The digest a tidal server reports for the version it loaded; ReplyError if the server
    says the update failed."""
    if kind == "tidal":
        if not isinstance(body, dict) or "manifest_sha256" not in body:
            raise ReplyError(f"the server's update_weights answer has no manifest_sha256: {body!r}")
        return body["manifest_sha256"]
    if kind == "sglang" and isinstance(body, dict) and body.get("success") is False:
        raise ReplyError(f"SGLang refused the weight update: {body.get('message')}")
    return None


def probe_path(kind: str) -> str:
    """A cheap GET that answers once the server is up."""
    return "/get_model_info" if kind == "sglang" else "/v1/models"
