"""A loopback stand-in of a vLLM server's OpenAI-compatible API (``vllm serve``), for the rollout
path that generates on a vLLM server. vLLM needs a CUDA GPU and cannot be installed here, so this
speaks its wire format (``/v1/models``, ``/v1/completions`` with token-id prompts,
``return_token_ids``, ``return_tokens_as_token_ids`` and ``logprobs``) over a tiny model sampled
with our HF generator. Every completion is kept in ``served`` for the tests to compare with.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from standins.http import LoopbackServer, Request, Response
from training.rollouts.generation import HFBatchGenerator


class VLLMStandIn:
    def __init__(self, model: Any, tokenizer: Any, name: str = "tiny-char", seed: int = 0) -> None:
        self.name = name
        self.generator = HFBatchGenerator(model, tokenizer, seed=seed)
        self.served: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()  # one forward pass at a time, as one engine
        self.server = LoopbackServer(self.handle)

    @property
    def url(self) -> str:
        return self.server.url

    def close(self) -> None:
        self.server.close()

    def handle(self, request: Request) -> Response:
        if request.method == "GET" and request.path == "/v1/models":
            return Response(body={"object": "list", "data": [{"id": self.name, "object": "model", "created": 0, "owned_by": "vllm"}]})
        if request.method == "POST" and request.path == "/v1/completions":
            return self.completions(request.json())
        return Response(404, {"object": "error", "message": f"Not Found: {request.path}", "type": "NotFoundError", "code": 404})

    def completions(self, body: dict[str, Any]) -> Response:
        self.requests.append(body)
        prompt = body["prompt"]
        if body.get("model") != self.name:
            return Response(404, {"object": "error", "message": f"The model `{body.get('model')}` does not exist.", "type": "NotFoundError", "code": 404})
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            return Response(400, {"object": "error", "message": "this stand-in takes one token-id prompt", "type": "BadRequestError", "code": 400})
        self.generator.temperature = float(body.get("temperature", 1.0))
        self.generator.top_p = float(body.get("top_p", 1.0))
        with self._lock:
            [output] = self.generator.generate_batch([prompt], [int(body.get("max_tokens", 16))])
        self.served.append({"prompt_ids": list(prompt), "completion_ids": output.completion_ids, "logprobs": output.logprobs})
        as_ids = body.get("return_tokens_as_token_ids", False)
        tokens = [f"token_id:{t}" if as_ids else self.generator.tokenizer.decode([t]) for t in output.completion_ids]
        logprobs = None
        if body.get("logprobs") is not None:
            logprobs = {
                "text_offset": list(range(len(tokens))),
                "token_logprobs": output.logprobs,
                "tokens": tokens,
                "top_logprobs": [{token: lp} for token, lp in zip(tokens, output.logprobs)],
            }
        choice = {
            "index": 0, "text": output.text, "logprobs": logprobs, "finish_reason": output.finish_reason,
            "stop_reason": None, "prompt_logprobs": None,
        }
        if body.get("return_token_ids"):
            choice.update(prompt_token_ids=list(prompt), token_ids=output.completion_ids)
        completion_tokens = len(output.completion_ids)
        return Response(body={
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()), "model": self.name,
            "choices": [choice],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": completion_tokens, "total_tokens": len(prompt) + completion_tokens},
        })
