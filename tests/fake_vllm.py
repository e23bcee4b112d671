"""A stand-in for `vllm serve` that speaks the parts of its protocol tidal uses (tests only):

    fake_vllm.py MODEL_DIR --port P [other flags ignored]
    GET /health, GET /v1/models, POST /v1/completions (vLLM's shape with return_token_ids and
    logprobs), POST /collective_rpc {"method": "reload_weights"}, POST /reset_prefix_cache

Its completion of a prompt is deterministic and depends on how many reloads it has done (the
"weights"), read from MODEL_DIR/config.json's "fake_generation" (0 when absent)."""

import argparse
import json
from pathlib import Path

from aiohttp import web


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    args, _ = parser.parse_known_args()
    folder = Path(args.model)
    state = {"generation": 0, "reloads": 0}

    def read_weights() -> None:
        state["generation"] = json.loads((folder / "config.json").read_text()).get("fake_generation", 0)

    async def health(_):
        return web.Response(text="")

    async def models(_):
        return web.json_response({"data": [{"id": "tidal", "reloads": state["reloads"]}]})

    async def completions(request):
        body = await request.json()
        last, n = body["prompt"][-1], body["max_tokens"]
        tokens = [(last + k + state["generation"]) % 250 + 1 for k in range(1, n + 1)]
        choice = {"index": 0, "text": "", "token_ids": tokens, "finish_reason": "length",
                  "stop_reason": None, "prompt_token_ids": body["prompt"],
                  "logprobs": {"token_logprobs": [-0.25] * n, "tokens": [], "top_logprobs": []}}
        return web.json_response({"id": "cmpl-fake", "choices": [choice]})

    async def rpc(request):
        body = await request.json()
        if body.get("method") != "reload_weights":
            return web.json_response({"error": "unknown method"}, status=400)
        read_weights()
        state["reloads"] += 1
        return web.json_response({"results": [None]})

    async def reset(_):
        return web.Response(text="")

    read_weights()
    app = web.Application()
    app.add_routes([web.get("/health", health), web.get("/v1/models", models),
                    web.post("/v1/completions", completions), web.post("/collective_rpc", rpc),
                    web.post("/reset_prefix_cache", reset)])
    web.run_app(app, host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
