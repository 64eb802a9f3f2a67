"""A stand-in for Fireworks' training platform, for the real ``fireworks-ai[training]`` SDK to talk to.

One loopback server plays the four HTTP surfaces the SDK uses, in their wire formats:

- the control plane (``/v1/accounts``, ``.../rlorTrainerJobs``, ``.../deployments``): create, get
  (jobs go CREATING -> RUNNING, deployments CREATING -> READY on the next poll) and delete;
- the trainer gateway (``/training/v1/rlorTrainerJobs/<account>/<job>/api/v1/...``): the
  Tinker-compatible trainer API, served by the tinker stand-in's handler with Fireworks' own
  protobuf messages (``fireworks.training.sdk._core.proto``);
- hot-load (``/hot_load/v1/models/hot_load``): loads a saved sampler snapshot into the deployment;
- inference (``/inference/v1/completions``): token-in/token-out streaming completions (SSE) with
  ``raw_output.completion_token_ids`` and per-token ``sampling_logprob``, from the hot-loaded weights.

Stand-in, not Fireworks: everything is one tiny torch model in one process; no shapes, regions,
replicas, delta compression or billing. It records what was created and deleted, so tests can
assert that a run leaves nothing running.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from urllib.parse import parse_qs

from fireworks.training.sdk._core.proto import tinker_public_pb2 as fireworks_pb

from standins.http import LoopbackServer, Request, Response
from standins.tinker_service import TinkerStandIn

ACCOUNT = "standin"
_JOB = re.compile(rf"^/v1/accounts/{ACCOUNT}/rlorTrainerJobs(?:/([^/:]+))?$")
_DEPLOYMENT = re.compile(rf"^/v1/accounts/{ACCOUNT}/deployments(?:/([^/]+))?$")
_GATEWAY = re.compile(rf"^/training/v1/rlorTrainerJobs/{ACCOUNT}/([^/]+)(/api/v1/.*)$")


class _FireworksTrainer(TinkerStandIn):
    """The trainer API as Fireworks' trainers answer it: DCP checkpoints by logical name, loaded
    from another (earlier) job through ``cross_job://<job>/<name>`` references."""

    def state_path(self, model_id: str, name: str) -> str:
        return name

    def resolve_state_path(self, path: str) -> str:
        return path.rsplit("/", 1)[-1] if path.startswith("cross_job://") else path


@dataclass
class FireworksStandIn:
    api_key: str = "fw-standin"
    fail: dict[str, int] = field(default_factory=dict)
    jobs: dict[str, dict] = field(default_factory=dict)
    deployments: dict[str, dict] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)  # "job:<id>" / "deployment:<id>"
    hotloads: list[str] = field(default_factory=list)
    completions: int = 0

    def __post_init__(self) -> None:
        self.trainer = _FireworksTrainer(api_key=self.api_key, fail=self.fail, pb=fireworks_pb, serve_http=False)
        self.server = LoopbackServer(self.handle)

    @property
    def url(self) -> str:
        return self.server.url

    def close(self) -> None:
        self.server.close()

    def running(self) -> list[str]:
        """Paid resources that exist and were not deleted."""
        return [f"job:{j}" for j in self.jobs] + [f"deployment:{d}" for d in self.deployments]

    def handle(self, request: Request) -> Response:
        if request.headers.get("X-Api-Key") != self.api_key:
            return Response(401, {"error": {"message": "invalid API key"}})
        path = request.path
        if path == "/v1/accounts":
            return Response(body={"accounts": [{"name": f"accounts/{ACCOUNT}"}]})
        if match := _GATEWAY.match(path):
            job = self.jobs.get(match.group(1))
            if job is None or job["state"] != "JOB_STATE_RUNNING":
                return Response(404, {"error": {"message": "no running trainer at this route"}})
            return self.trainer.handle(Request(request.method, match.group(2), request.headers, request.body))
        if match := _JOB.match(path):
            return self.on_job(request, match.group(1))
        if match := _DEPLOYMENT.match(path):
            return self.on_deployment(request, match.group(1))
        if path == "/hot_load/v1/models/hot_load":
            return self.on_hotload(request)
        if path == "/inference/v1/completions":
            return self.on_completions(request)
        return Response(404, {"error": {"message": f"stand-in has no {request.method} {path}"}})

    # -- control plane -------------------------------------------------------------------
    def on_job(self, request: Request, job_id: str | None) -> Response:
        if request.method == "POST" and job_id is None:
            job_id = parse_qs(request.query)["rlorTrainerJobId"][0]
            body = request.json()
            self.jobs[job_id] = {
                "name": f"accounts/{ACCOUNT}/rlorTrainerJobs/{job_id}", "state": "JOB_STATE_CREATING",
                "trainingConfig": body["trainingConfig"], "displayName": body.get("displayName", ""),
            }
            return Response(body=self.jobs[job_id])
        job = self.jobs.get(job_id)
        if job is None:
            return Response(404, {"error": {"message": f"trainer job {job_id} not found"}})
        if request.method == "DELETE":
            if self.fail.get("delete"):  # injected: the service refuses to delete (not retried by the SDK)
                return Response(403, {"error": {"message": "stand-in: injected refusal to delete"}})
            del self.jobs[job_id]
            self.deleted.append(f"job:{job_id}")
            return Response(body={})
        reply = dict(job)
        job["state"] = "JOB_STATE_RUNNING"  # placed and healthy by the next poll
        return Response(body=reply)

    def on_deployment(self, request: Request, deployment_id: str | None) -> Response:
        if request.method == "POST" and deployment_id is None:
            deployment_id = parse_qs(request.query)["deploymentId"][0]
            body = request.json()
            self.deployments[deployment_id] = {
                "name": f"accounts/{ACCOUNT}/deployments/{deployment_id}", "state": "CREATING",
                "baseModel": body["baseModel"], "hotLoadTrainerJob": body.get("hotLoadTrainerJob"), "snapshot": None,
            }
            return Response(body={k: v for k, v in self.deployments[deployment_id].items() if k != "snapshot"})
        deployment = self.deployments.get(deployment_id)
        if deployment is None:
            return Response(404, {"error": {"message": f"deployment {deployment_id} not found"}})
        if request.method == "DELETE":
            if self.fail.get("delete"):  # injected: the service refuses to delete (not retried by the SDK)
                return Response(403, {"error": {"message": "stand-in: injected refusal to delete"}})
            del self.deployments[deployment_id]
            self.deleted.append(f"deployment:{deployment_id}")
            return Response(body={})
        reply = {k: v for k, v in deployment.items() if k != "snapshot"}
        deployment["state"] = "READY"
        return Response(body=reply)

    def _deployment_of(self, request: Request) -> dict | None:
        name = request.headers.get("fireworks-deployment") or ""
        return self.deployments.get(name.rsplit("/", 1)[-1])

    def on_hotload(self, request: Request) -> Response:
        deployment = self._deployment_of(request)
        if deployment is None:
            return Response(404, {"error": {"message": "no such deployment"}})
        if request.method == "POST":
            identity = request.json()["identity"]
            if identity not in self.trainer.sampler_names:
                return Response(400, {"error": {"message": f"no snapshot {identity}"}})
            deployment["snapshot"] = identity
            self.hotloads.append(identity)
            return Response(body={})
        replica = {"current_snapshot_identity": deployment["snapshot"], "readiness": True, "loading_state": {"stage": "done"}}
        return Response(body={"replicas": [replica]})

    # -- inference -----------------------------------------------------------------------
    def on_completions(self, request: Request) -> Response:
        body = request.json()
        deployment = self.deployments.get(body["model"].rsplit("/", 1)[-1])
        if deployment is None:
            return Response(404, {"error": {"message": f"model {body['model']} not found"}})
        self.completions += 1
        if self.fail.get("completions") == self.completions:
            return Response(400, {"error": {"message": "stand-in: injected failure of a completion"}})
        identity = deployment["snapshot"]
        if identity is None:  # a warm-up probe before any hot-load: the base model answers
            tokens, logprobs, stopped = [], [], True
        else:
            path = self.trainer.sampler_names[identity]
            tokens, logprobs, stopped = self.trainer.sampler.sample(
                path, self.trainer.snapshots[path].weights, list(body["prompt"]), body.get("max_tokens") or 16,
                body.get("temperature", 1.0), body.get("top_p", 1.0), body.get("seed"),
            )
        choice = {
            "index": 0,
            "text": self.trainer.sampler.tokenizer.decode(tokens, skip_special_tokens=True),
            "logprobs": {"content": [{"token_id": t, "logprob": lp, "sampling_logprob": lp} for t, lp in zip(tokens, logprobs)]},
            "finish_reason": "stop" if stopped else "length",
            "raw_output": {"prompt_token_ids": list(body["prompt"]), "completion_token_ids": tokens},
        }
        if not body.get("stream"):
            return Response(body={"id": "cmpl-standin", "choices": [choice], "usage": {"completion_tokens": len(tokens)}})
        events = [
            {"id": "cmpl-standin", "choices": [choice]},
            {"id": "cmpl-standin", "choices": [], "usage": {"completion_tokens": len(tokens)}},
        ]
        stream = [f"data: {json.dumps(event)}\n\n".encode() for event in events] + [b"data: [DONE]\n\n"]
        return Response(stream=stream, content_type="text/event-stream")
