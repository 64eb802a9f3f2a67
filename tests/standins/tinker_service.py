"""A stand-in for Tinker's training service, for the real ``tinker`` SDK (0.38) to talk to.

It speaks the SDK's wire format on a loopback port: JSON requests and futures
(``/api/v1/retrieve_future``), the protobuf ``forward_backward`` request and the protobuf
``SampleResponse`` / ``ForwardBackwardOutput`` results, encoded with the SDK's own published
message definitions (``tinker.proto.tinker_public_pb2``). Behind it is a real tiny torch model
(``standins.policy``). Point the SDK at it with ``TINKER_BASE_URL`` or ``base_url``.

Stand-in, not Tinker: one process, no LoRA (the whole tiny model trains), futures are complete
when first polled, no JWT exchange (the client config turns it off), no billing or rate limits.
``fail`` makes the n-th call of a kind fail the way the service reports a failed request.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

from standins.http import LoopbackServer, Request, Response
from standins.policy import SamplerPool, Snapshot, TinyPolicy

PROTO = "application/x-protobuf"


@dataclass
class _Future:
    result: object = None  # dict (JSON) or bytes (protobuf)
    error: str | None = None


@dataclass
class TinkerStandIn:
    api_key: str = "tml-standin"
    fail: dict[str, int] = field(default_factory=dict)  # call kind -> fail its n-th call (1-based)
    models: dict[str, TinyPolicy] = field(default_factory=dict)
    snapshots: dict[str, Snapshot] = field(default_factory=dict)  # tinker:// path -> weights
    sessions: dict[str, dict] = field(default_factory=dict)
    sampling_sessions: dict[str, str] = field(default_factory=dict)  # id -> sampler weights path
    counts: dict[str, int] = field(default_factory=dict)
    sampler_names: dict[str, str] = field(default_factory=dict)  # name the client gave -> path
    batches: list[list[dict]] = field(default_factory=list)  # each forward_backward's datums, as received
    learning_rates: list[float] = field(default_factory=list)  # each optim_step's Adam learning rate, as received
    lora_configs: list[dict] = field(default_factory=list)  # each create_model's lora_config, as received

    pb: object = pb  # the protobuf messages of the SDK being served (tinker's or Fireworks' fork)
    serve_http: bool = True

    def __post_init__(self) -> None:
        self._futures: dict[str, _Future] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.sampler = SamplerPool()
        self.server = LoopbackServer(self.handle) if self.serve_http else None

    @property
    def url(self) -> str:
        return self.server.url

    def close(self) -> None:
        self.server.close()

    # -- plumbing ------------------------------------------------------------------------
    def _next(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    def _future(self, kind: str, compute, **extra) -> Response:
        with self._lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            failing = self.fail.get(kind) == self.counts[kind]
        request_id = self._next("req")
        if failing:
            self._futures[request_id] = _Future(error=f"stand-in: injected failure of {kind} call {self.counts[kind]}")
        else:
            try:
                self._futures[request_id] = _Future(result=compute())
            except ValueError as exc:  # the request was wrong: a user error, as the service reports it
                self._futures[request_id] = _Future(error=str(exc))
        return Response(body={"request_id": request_id, **extra})

    def handle(self, request: Request) -> Response:
        if request.headers.get("X-API-Key") != self.api_key and request.path != "/api/v1/healthz":
            return Response(401, {"detail": "invalid API key"})
        path = request.path
        if path.startswith("/api/v1/sessions/") and path.endswith("/finish"):
            session_id = path.split("/")[4]
            self.sessions.setdefault(session_id, {})["finished"] = request.json().get("reason", {}).get("type")
            return Response(body={})
        if path.startswith("/api/v1/samplers/"):
            sampler_id = path.rsplit("/", 1)[1]
            return Response(body={"sampler_id": sampler_id, "base_model": "tiny-char", "model_path": self.sampling_sessions.get(sampler_id)})
        route = getattr(self, "on_" + path.removeprefix("/api/v1/").replace("/", "_"), None)
        if route is None:
            return Response(404, {"detail": f"stand-in has no {request.method} {path}"})
        return route(request)

    # -- session -------------------------------------------------------------------------
    def on_healthz(self, request: Request) -> Response:
        return Response(body={"status": "ok"})

    def on_client_config(self, request: Request) -> Response:
        return Response(body={"pjwt_auth_enabled": False})

    def on_client_dynamic_config(self, request: Request) -> Response:
        return Response(body={})

    def on_telemetry(self, request: Request) -> Response:
        return Response(body={"status": "accepted"})

    def on_create_session(self, request: Request) -> Response:
        session_id = self._next("session")
        self.sessions[session_id] = {"tags": request.json().get("tags"), "finished": None}
        return Response(body={"type": "create_session", "session_id": session_id})

    def on_session_heartbeat(self, request: Request) -> Response:
        return Response(body={"type": "session_heartbeat"})

    # -- models and weights --------------------------------------------------------------
    def on_create_model(self, request: Request) -> Response:
        body = request.json()
        model_id = f"{body['session_id']}:train:{body['model_seq_id']}"
        lora = body.get("lora_config") or {}
        self.lora_configs.append(lora)

        def create():
            self.models[model_id] = TinyPolicy(body["base_model"], lora_rank=lora.get("rank", 0), seed=0)
            return {"model_id": model_id, "type": "create_model"}

        return self._future("create_model", create, model_id=model_id)

    def on_get_info(self, request: Request) -> Response:
        model_id = request.json()["model_id"]
        policy = self.models[model_id]
        return Response(body={
            "type": "get_info", "model_id": model_id, "is_lora": True, "lora_rank": policy.lora_rank,
            "model_name": policy.base_model, "model_data": {"arch": "qwen2", "model_name": policy.base_model},
        })

    def on_save_weights_for_sampler(self, request: Request) -> Response:
        body = request.json()
        model_id = body["model_id"]

        def save():
            path = f"tinker://{model_id}/sampler_weights/{body.get('path') or self._next('ephemeral')}"
            self.snapshots[path] = self.models[model_id].snapshot(with_optimizer=False)
            self.sampler_names[body.get("path") or path] = path
            if body.get("path"):
                return {"path": path, "type": "save_weights_for_sampler"}
            session_id = self._next("sampling")
            self.sampling_sessions[session_id] = path
            return {"sampling_session_id": session_id, "type": "save_weights_for_sampler"}

        return self._future("save_weights_for_sampler", save)

    def on_save_weights(self, request: Request) -> Response:
        body = request.json()
        model_id = body["model_id"]

        def save():
            path = self.state_path(model_id, body["path"])
            self.snapshots[path] = self.models[model_id].snapshot(with_optimizer=True)
            return {"path": path, "type": "save_weights"}

        return self._future("save_weights", save)

    def on_load_weights(self, request: Request) -> Response:
        body = request.json()
        # Into an existing model (TrainingClient.load_state*) or a new one (ServiceClient.create_*_from_state).
        model_id = body.get("model_id") or f"{body['session_id']}:train:{body['model_seq_id']}"

        def load():
            snapshot = self.snapshots.get(self.resolve_state_path(body["path"]))
            if snapshot is None:
                raise ValueError(f"no checkpoint at {body['path']}")
            policy = self.models.get(model_id) or TinyPolicy(body.get("base_model") or "tiny-char", seed=0)
            policy.restore(snapshot if body.get("optimizer") else Snapshot(snapshot.weights))
            self.models[model_id] = policy
            return {"path": body["path"], "model_id": model_id, "type": "load_weights"}

        return self._future("load_weights", load)

    def state_path(self, model_id: str, name: str) -> str:
        """Where ``save_state(name)`` puts a checkpoint (Tinker: a tinker:// path)."""
        return f"tinker://{model_id}/weights/{name}"

    def resolve_state_path(self, path: str) -> str:
        return path

    # -- training ------------------------------------------------------------------------
    def on_forward_backward(self, request: Request) -> Response:
        """The SDK sends protobuf (tinker) or JSON (Fireworks' fork, ``proto_write_fwdbwd`` off)."""
        if PROTO in (request.headers.get("Content-Type") or ""):
            message = self.pb.ForwardBackwardRequest()
            message.ParseFromString(request.body)
            model_id, loss_fn, forward_only = message.model_id, message.loss_fn, message.forward_only
            config = {k: v.number for k, v in message.loss_fn_config_v2.items()} or dict(message.loss_fn_config)
            datums = [
                {"input": [int(t) for chunk in d.model_input for t in np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32)],
                 **{name: _tensor(self.pb, t) for name, t in d.loss_fn_inputs.items()}}
                for d in message.data
            ]
        else:
            body = request.json()
            model_id, forward_only = body["model_id"], False
            data = body["forward_backward_input"]
            loss_fn, config = data["loss_fn"], data.get("loss_fn_config") or {}
            datums = [
                {"input": [t for chunk in d["model_input"]["chunks"] for t in chunk["tokens"]],
                 **{name: t["data"] for name, t in d["loss_fn_inputs"].items()}}
                for d in data["data"]
            ]

        self.batches.append(datums)

        def run():
            if forward_only:
                raise ValueError("forward_only is not implemented by this stand-in")
            logprobs, loss = self.models[model_id].forward_backward(datums, loss_fn, config)
            return _forward_backward_output(self.pb, logprobs, loss)

        return self._future("forward_backward", run, model_id=model_id)

    def on_optim_step(self, request: Request) -> Response:
        body = request.json()
        params = body.get("adam_params") or body.get("optim_params") or body["optimizer_params"]
        self.learning_rates.append(float(params["learning_rate"]))

        def step():
            metrics = self.models[body["model_id"]].optim_step(
                params["learning_rate"], params.get("beta1", 0.9), params.get("beta2", 0.95), params.get("eps", 1e-12),
                params.get("weight_decay", 0.0), params.get("grad_clip_norm", 0.0),
            )
            return {"metrics": metrics}

        return self._future("optim_step", step, model_id=body["model_id"])

    # -- sampling ------------------------------------------------------------------------
    def on_create_sampling_session(self, request: Request) -> Response:
        body = request.json()
        if body.get("model_path") not in self.snapshots:
            return Response(404, {"detail": f"no sampler weights at {body.get('model_path')}"})
        session_id = self._next("sampling")
        self.sampling_sessions[session_id] = body["model_path"]
        return Response(body={"type": "create_sampling_session", "sampling_session_id": session_id})

    def on_asample(self, request: Request) -> Response:
        body = request.json()
        path = self.sampling_sessions[body["sampling_session_id"]]
        prompt = [t for chunk in body["prompt"]["chunks"] for t in chunk["tokens"]]
        params = body["sampling_params"]
        sequence_ids = [self._next("seq") for _ in range(body.get("num_samples", 1))]

        def sample():
            response = self.pb.SampleResponse()
            for _ in sequence_ids:
                tokens, logprobs, stopped = self.sampler.sample(
                    path, self.snapshots[path].weights, prompt, params.get("max_tokens") or 16,
                    params.get("temperature", 1.0), params.get("top_p", 1.0), params.get("seed"),
                )
                response.sequences.add(
                    stop_reason=self.pb.STOP_REASON_STOP if stopped else self.pb.STOP_REASON_LENGTH,
                    tokens=np.asarray(tokens, dtype=np.int32).tobytes(),
                    logprobs=np.asarray(logprobs, dtype=np.float32).tobytes(),
                )
            return response.SerializeToString()

        return self._future("sample", sample, sample_sequence_ids=sequence_ids)

    def on_retrieve_future(self, request: Request) -> Response:
        future = self._futures.get(request.json()["request_id"])
        if future is None:
            return Response(404, {"detail": "unknown request"})
        if future.error is not None:
            return Response(body={"error": future.error, "category": "server"})
        if isinstance(future.result, bytes):
            return Response(raw=future.result, content_type=PROTO)
        return Response(body=future.result)


def _tensor(pb, message) -> list:
    dtype = np.float32 if message.dtype == pb.DTYPE_FLOAT32 else np.int64
    return np.frombuffer(message.dense, dtype=dtype).tolist()


def _forward_backward_output(pb, logprobs: list[list[float]], loss: float) -> bytes:
    flat = np.concatenate([np.asarray(lp, dtype=np.float32) for lp in logprobs]) if logprobs else np.zeros(0, np.float32)
    offsets = np.cumsum([0] + [len(lp) * 4 for lp in logprobs]).astype(np.int64)
    output = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics={"loss:sum": loss})
    record = output.loss_fn_outputs.add(num_datums=len(logprobs))
    record.fields["logprobs"].CopyFrom(pb.BatchedTensor(data=flat.tobytes(), offsets=offsets.tobytes(), dtype=pb.DTYPE_FLOAT32))
    return output.SerializeToString()
