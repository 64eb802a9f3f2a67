"""The ``fireworks`` backend: Fireworks' training SDK (``fireworks-ai[training]``, Tinker-compatible).

The training step is the tinker backend's (``training.backends.tinker_protocol.service``); what differs is explicit here:

- **Provisioning.** A run creates its own paid resources: an RLOR trainer job
  (``TrainerJobManager``) and a hot-load rollout deployment attached to it (``DeploymentManager``).
  Their ids are reported as soon as they exist (the run page shows them), and ``close`` deletes
  both at the end, on failure and on cancel, then checks that they are gone and logs an error
  naming any that is not. A process killed before its teardown (a lost worker) cannot delete
  anything, so each resource is also written to ``<run>/fireworks_resources.json`` when created
  and struck off once seen deleted; the run's next attempt (the platform's retry, or a re-run in
  the same folder) deletes what is listed there before it provisions its own.
- **Sampling** goes through the deployment (``DeploymentSampler``, token ids in, ids and sampling
  log-probabilities out), not a Tinker sampling client.
- **Publishing weights** is ``WeightSyncer.save_and_hotload``: sampler weights are saved on the
  trainer and hot-loaded into the deployment after every step.
- **Resume** creates a fresh trainer job and loads the recorded checkpoint of the earlier run's
  job with its optimizer state (a cross-job reference, ``resolve_checkpoint_path`` +
  ``load_state_with_optimizer``).
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from training.backends.tinker_protocol.service import (
    CheckpointRecord,
    RemoteGenerator,
    RemoteProcessor,
    SampleResult,
    ServiceSession,
    remote_call,
)
from training.log import logger

DEFAULT_BASE_URL = "https://api.fireworks.ai"
LEDGER_FILE = "fireworks_resources.json"


class ResourceLedger:
    """The paid resources of a run not yet seen deleted (``[{"kind": "job"|"deployment", "id": ...}]``),
    kept in the run's folder so that they outlive the process that created them.

    The one file of the run that every attempt writes, a superseded one too: what it provisioned
    must be listed to be deleted, whoever holds the run. Each change is a read and a rewrite under
    an exclusive lock of ``<ledger>.lock``, so an attempt and the one that took it over never drop
    each other's entries."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def entries(self) -> list[dict[str, str]]:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return []

    def add(self, kind: str, resource_id: str) -> None:
        with self._locked():
            self._write([*self.entries(), {"kind": kind, "id": resource_id}])

    def remove(self, kind: str, resource_id: str) -> None:
        with self._locked():
            self._write([e for e in self.entries() if (e["kind"], e["id"]) != (kind, resource_id)])

    @contextmanager
    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or its process dies
            yield

    def _write(self, entries: list[dict[str, str]]) -> None:
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        temporary.write_text(json.dumps(entries))
        temporary.replace(self.path)  # never half-written, even if the process dies here


class FireworksSession(ServiceSession):
    service = "fireworks"

    def __init__(self, config: Any, resume: CheckpointRecord | None, api_key: str, run_name: str, on_ids=None,
                 ledger: ResourceLedger | None = None) -> None:
        super().__init__()
        from fireworks.training import sdk

        self.sdk, self.types, self.config = sdk, sdk, config
        self.on_ids = on_ids
        model, remote = config.actor_rollout_ref.model, config.remote
        self.base_url = remote.base_url or os.environ.get("FIREWORKS_BASE_URL") or DEFAULT_BASE_URL
        self.api_key = api_key
        self.job_id: str | None = None
        self.deployment_id: str | None = None
        self.service_client: Any = None
        self.trainer_mgr = sdk.TrainerJobManager(api_key=api_key, base_url=self.base_url)
        self.deploy_mgr = sdk.DeploymentManager(api_key=api_key, base_url=self.base_url)
        self.ledger = ledger
        self._delete_leftovers()
        try:
            self._provision(model, remote, run_name)
            self.service_client = sdk.FiretitanServiceClient(base_url=self.endpoint.base_url, api_key=api_key)
            self.training_client = remote_call(
                "fireworks", "creating the training client",
                lambda: self.service_client.create_training_client(
                    base_model=model.path, lora_rank=model.lora_rank, seed=config.trainer.seed,
                    train_unembed=remote.lora_train_unembed, train_attn=remote.lora_train_attn, train_mlp=remote.lora_train_mlp,
                ),
            )
            if resume is not None:  # a checkpoint of the earlier run's (deleted) trainer job, by cross-job reference
                source_job = resume.remote_ids.get("fireworks_trainer_job")
                remote_call(
                    "fireworks", f"loading the checkpoint {resume.state_path} of trainer job {source_job}",
                    lambda: self.training_client.load_state_with_optimizer(
                        self.training_client.resolve_checkpoint_path(resume.state_path, source_job_id=source_job)
                    ).result(),
                )
            self.syncer = sdk.WeightSyncer(
                policy_client=self.training_client, deploy_mgr=self.deploy_mgr, deployment_id=self.deployment_id,
                base_model=model.path, lora_rank=model.lora_rank, hotload_timeout=int(remote.ready_timeout_s),
            )
        except BaseException:
            self.close("errored")
            raise

    def _provision(self, model: Any, remote: Any, run_name: str) -> None:
        sdk = self.sdk
        job = remote_call("fireworks", "creating the trainer job", lambda: self.trainer_mgr.create(sdk.TrainerJobConfig(
            base_model=model.path, lora_rank=model.lora_rank, learning_rate=self.config.actor_rollout_ref.actor.optim.lr,
            display_name=run_name[:60], region=remote.region, training_shape_ref=remote.training_shape,
            auto_select_training_shape=remote.training_shape is None,
        )))
        self.job_id = job.job_id
        self._record("job", job.job_id)
        self._report("fireworks_trainer_job", job.job_id)
        self.endpoint = remote_call("fireworks", f"waiting for trainer job {job.job_id}", lambda: self.trainer_mgr.wait_for_ready(
            job.job_id, job_name=job.job_name, poll_interval_s=remote.poll_interval_s, timeout_s=remote.ready_timeout_s,
        ))
        deployment_id = f"agent-trainer-{uuid.uuid4().hex[:12]}"
        self.deployment_id = deployment_id
        self._record("deployment", deployment_id)
        self._report("fireworks_deployment", deployment_id)
        options = {"accelerator_type": remote.accelerator_type} if remote.accelerator_type else {}
        remote_call("fireworks", f"creating deployment {deployment_id}", lambda: self.deploy_mgr.create_or_get(sdk.DeploymentConfig(
            deployment_id=deployment_id, base_model=model.path, region=remote.region, min_replica_count=1,
            hot_load_trainer_job=self.endpoint.job_name, for_training=True, **options,
        )))
        info = remote_call("fireworks", f"waiting for deployment {deployment_id}", lambda: self.deploy_mgr.wait_for_ready(
            deployment_id, timeout_s=remote.ready_timeout_s, poll_interval_s=remote.poll_interval_s,
        ))
        self.inference_model = info.inference_model

    def _record(self, kind: str, resource_id: str) -> None:
        if self.ledger is not None:
            self.ledger.add(kind, resource_id)

    def _delete_leftovers(self) -> None:
        """Delete what an earlier attempt of this run created and never saw deleted (it was killed)."""
        if self.ledger is None:
            return
        leftovers = self.ledger.entries()
        if not leftovers:
            return
        logger.warning("an earlier attempt of this run left fireworks resources behind; deleting them: %s",
                       ", ".join(f"{e['kind']} {e['id']}" for e in leftovers))
        left = [f"{e['kind']} {e['id']}" for e in leftovers if not self._teardown(e["kind"], e["id"])]
        if left:
            logger.error("fireworks resources of an earlier attempt may still be running and billing: %s; delete them in "
                         "the Fireworks console.", ", ".join(left))

    def _teardown(self, kind: str, resource_id: str) -> bool:
        return _teardown(self.trainer_mgr, self.deploy_mgr, self.ledger, kind, resource_id)

    def _report(self, key: str, value: str) -> None:
        self.remote_ids[key] = value
        if self.on_ids is not None:
            self.on_ids(dict(self.remote_ids))

    def publish(self, name: str) -> str:
        return self.syncer.save_and_hotload(name)

    def save_state(self, name: str) -> str:
        return self.training_client.save_state(name).result().path

    def generator(self, tokenizer: Any, temperature: float | None = None, top_p: float | None = None) -> RemoteGenerator:
        rollout = self.config.actor_rollout_ref.rollout
        temperature = rollout.temperature if temperature is None else temperature
        top_p = rollout.top_p if top_p is None else top_p
        sampler = self.sdk.DeploymentSampler(
            inference_url=self.deploy_mgr.inference_url, model=self.inference_model, api_key=self.api_key, tokenizer=tokenizer,
        )

        async def sample(prompt_ids: list[int], max_new_tokens: int) -> SampleResult:
            try:
                completions = await sampler.sample_with_prompt_tokens(
                    prompt_ids, n=1, max_tokens=max_new_tokens, temperature=temperature, top_p=top_p, logprobs=True,
                )
            except Exception as exc:
                raise RuntimeError(f"fireworks sampling failed: {type(exc).__name__}: {exc}") from exc
            completion = completions[0]
            ids = completion.full_tokens[completion.prompt_len :]
            logprobs = completion.sampling_logprobs or completion.inference_logprobs or []
            if any(lp is None for lp in logprobs):
                raise RuntimeError("fireworks sampling returned tokens without sampling log-probabilities")
            return SampleResult(ids, [float(lp) for lp in logprobs], completion.finish_reason == "stop")

        return RemoteGenerator(sample, tokenizer, "fireworks")

    def close(self, outcome: str = "success") -> None:
        """Delete the deployment and the trainer job (both paid), then check that they are gone."""
        if self.service_client is not None:
            try:
                self.service_client.close()
            except Exception as exc:
                logger.warning("closing the fireworks training client failed: %s", exc)
        left = []
        if self.deployment_id and not self._teardown("deployment", self.deployment_id):
            left.append(f"deployment {self.deployment_id}")
        if self.job_id and not self._teardown("job", self.job_id):
            left.append(f"trainer job {self.job_id}")
        if left:
            logger.error("fireworks resources may still be running and billing: %s; delete them in the Fireworks console.", ", ".join(left))
        else:
            logger.info("fireworks resources deleted (%s): %s", outcome, self.remote_ids or "none were created")


def _teardown(trainer_mgr: Any, deploy_mgr: Any, ledger: ResourceLedger | None, kind: str, resource_id: str) -> bool:
    """Delete one resource (the SDK's delete is best-effort), then check; True when it is gone
    (struck off the ledger then). One already deleted is gone: the SDK reads a 404 as absent."""
    if kind == "deployment":
        deploy_mgr.delete(resource_id)
        gone = not _still_there(lambda: deploy_mgr.get(resource_id))
    else:
        trainer_mgr.delete(resource_id)
        gone = not _still_there(lambda: trainer_mgr.try_get(resource_id))
    if gone and ledger is not None:
        ledger.remove(kind, resource_id)
    return gone


# The run's remote ids (as reported to ``on_ids``) that name a paid resource, and its ledger kind.
_PAID = (("fireworks_deployment", "deployment"), ("fireworks_trainer_job", "job"))
_KIND_NAMES = {"deployment": "deployment", "job": "trainer job"}


def delete_abandoned_resources(
    remote_ids: dict[str, str], run_path: str | Path | None, api_key: str, base_url: str | None = None,
) -> tuple[list[str], list[str]]:
    """Delete the paid resources of a run whose training process is gone for good (its last
    attempt lost with its machine, or cancelled with no worker left to stop it), which therefore
    never ran its own teardown: the ids recorded on the run (``remote_ids``) and those still in its
    ledger (``<run_path>/fireworks_resources.json``, when that folder is here). Called by the
    platform's liveness sweep, which passes the ids and the credentials (this library knows nothing
    of the platform). Deployments go first: they hot-load from the job. Returns (deleted, left),
    each resource as "deployment <id>" / "trainer job <id>"; never raises for a resource that
    could not be deleted (it is in ``left``)."""
    from fireworks.training import sdk

    ledger = ResourceLedger(Path(run_path) / LEDGER_FILE) if run_path else None
    wanted = [(kind, remote_ids[key]) for key, kind in _PAID if remote_ids.get(key)]
    for entry in ledger.entries() if ledger is not None else []:
        if (entry["kind"], entry["id"]) not in wanted:
            wanted.append((entry["kind"], entry["id"]))
    wanted.sort(key=lambda item: item[0] != "deployment")
    if not wanted:
        return [], []
    base_url = base_url or os.environ.get("FIREWORKS_BASE_URL") or DEFAULT_BASE_URL
    deleted, left = [], []
    try:
        trainer_mgr = sdk.TrainerJobManager(api_key=api_key, base_url=base_url)
        deploy_mgr = sdk.DeploymentManager(api_key=api_key, base_url=base_url)
    except Exception as exc:  # the account could not even be looked up: nothing was deleted
        logger.error("cannot reach fireworks at %s to delete a lost run's resources: %s: %s", base_url, type(exc).__name__, exc)
        return [], [f"{_KIND_NAMES[kind]} {resource_id}" for kind, resource_id in wanted]
    for kind, resource_id in wanted:
        (deleted if _teardown(trainer_mgr, deploy_mgr, ledger, kind, resource_id) else left).append(f"{_KIND_NAMES[kind]} {resource_id}")
    return deleted, left


def _still_there(get) -> bool:
    try:
        found = get()
    except Exception:
        return True  # cannot tell: say so rather than claim it is gone
    if found is None:
        return False
    state = found.get("state", "") if isinstance(found, dict) else getattr(found, "state", "")
    return state not in ("DELETED", "DELETING", "JOB_STATE_DELETED", "JOB_STATE_DELETING")


class FireworksProcessor(RemoteProcessor):
    name = "fireworks"
    sdk_package = "fireworks"
    sdk_install = "fireworks-ai[training]==1.2.28"
    api_key_env = "FIREWORKS_API_KEY"

    @classmethod
    def release_abandoned(cls, remote_ids: dict[str, str], run_path: str | Path | None,
                          base_url: str | None = None) -> tuple[list[str], list[str]]:
        """The job and deployment a lost run left running, deleted (``delete_abandoned_resources``)
        with the API key of this process's environment."""
        api_key = os.environ.get(cls.api_key_env)
        if not api_key:
            wanted = [f"{_KIND_NAMES[kind]} {remote_ids[key]}" for key, kind in _PAID if remote_ids.get(key)]
            if wanted:
                logger.error("%s is not set here: cannot delete %s", cls.api_key_env, ", ".join(wanted))
            return [], wanted
        return delete_abandoned_resources(remote_ids, run_path, api_key, base_url)

    def open_session(self, resume: CheckpointRecord | None) -> FireworksSession:
        return FireworksSession(
            self.config, resume, os.environ[self.api_key_env], run_name=f"agent-trainer {self.config.trainer.experiment_name}",
            on_ids=self.remote_ids_callback, ledger=ResourceLedger(self.path / LEDGER_FILE),
        )
