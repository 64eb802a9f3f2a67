"""Finding 4: one number or a few hundred bytes must not exhaust a worker or the web process.

Every numeric config key has an upper bound on the platform (an admin may raise it per backend);
YAML anchors and aliases are refused; overrides, names, notes and tags have sizes; error messages
are capped. All of it is refused in the form and in the API before anything is queued."""

from __future__ import annotations

import json
import time

import pytest

from webapp.policy import limits
from webapp.runs.models import Run

FORM_URL = "/runs/new/"

BOMBS = [
    ("data.train_batch_size", "1e9", 1024),
    ("trainer.total_training_steps", "1e12", 100_000),
    ("trainer.cpu_threads", "100000", 16),
    ("data.max_response_length", "1e9", 32_768),
    ("actor_rollout_ref.model.tiny_hidden_size", "1e9", 1024),
    ("rllm.agent.n_parallel_tasks", "10**9", None),  # not a number at all: the config refuses its type
]

# 350 bytes that expand to 9**7 (4.8 million) strings: the "billion laughs" of YAML.
ALIAS_BOMB = (
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
)


def _form_errors(response) -> dict[str, str]:
    assert response.status_code == 200, "an invalid form re-renders the page"
    return {field: " ".join(messages) for field, messages in response.context["form"].errors.items()}


@pytest.mark.parametrize(("key", "value", "bound"), [b for b in BOMBS if b[2]])
def test_a_number_above_its_bound_is_refused_in_the_form(owner_client, copy_form_data, apply_async, key, value, bound):
    copy_form_data["overrides"] = f"{key}={value}"
    errors = _form_errors(owner_client.post(FORM_URL, copy_form_data))
    assert key in errors["overrides"] and f"at most {bound}" in errors["overrides"], errors
    assert "backend trl" in errors["overrides"]
    assert Run.objects.count() == 0


@pytest.mark.parametrize(("key", "value", "bound"), [b for b in BOMBS if b[2]])
def test_a_number_above_its_bound_is_refused_by_the_api(api_client, owner, registry, apply_async, key, value, bound):
    response = api_client(owner).post("/api/runs/", {
        "agent": "copy-task", "dataset": "copy", "reward": "char-accuracy", "backend": "trl", "model": "tiny-char",
        "overrides": {key: float(value)},
    }, format="json")
    assert response.status_code == 400
    message = " ".join(response.json()["overrides"])
    assert key in message and f"at most {bound}" in message
    assert Run.objects.count() == 0


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "nan", "inf"])
def test_non_finite_numbers_are_refused(owner_client, copy_form_data, apply_async, value):
    copy_form_data["overrides"] = f"rllm.agent.trajectory_timeout={value}"
    errors = _form_errors(owner_client.post(FORM_URL, copy_form_data))
    assert "rllm.agent.trajectory_timeout" in errors["overrides"]
    assert "finite" in errors["overrides"] or "at most" in errors["overrides"]
    assert Run.objects.count() == 0


def test_trl_names_are_bounded_as_the_keys_they_set(owner_client, copy_form_data, apply_async):
    copy_form_data["overrides"] = "num_generations=100000"
    errors = _form_errors(owner_client.post(FORM_URL, copy_form_data))
    assert "actor_rollout_ref.rollout.n" in errors["overrides"] and "at most 64" in errors["overrides"]


def test_an_admin_raises_a_bound_for_one_backend(owner_client, copy_form_data, registry, apply_async, django_capture_on_commit_callbacks):
    copy_form_data["overrides"] = "trainer.total_training_steps=200000\ndata.train_batch_size=2\nactor_rollout_ref.rollout.n=2"
    errors = _form_errors(owner_client.post(FORM_URL, copy_form_data))
    assert "at most 100000" in errors["overrides"]
    backend = registry["backends"]["trl"]
    backend.config_limits = {"trainer.total_training_steps": 1_000_000}
    backend.full_clean()
    backend.save()
    with django_capture_on_commit_callbacks(execute=True):
        response = owner_client.post(FORM_URL, copy_form_data)
    assert response.status_code == 302, response.context["form"].errors if response.context else response
    run = Run.objects.get()
    assert run.config_overrides["trainer.total_training_steps"] == 200_000 and run.status == Run.Status.QUEUED


def test_a_backends_bounds_name_known_keys_and_finite_numbers(registry):
    from django.core.exceptions import ValidationError

    backend = registry["backends"]["trl"]
    for bad in ({"trainer.total_training_step": 5}, {"trainer.total_training_steps": "lots"},
                {"trainer.total_training_steps": float("inf")}, ["trainer.total_training_steps"]):
        backend.config_limits = bad
        with pytest.raises(ValidationError):
            backend.full_clean()


def test_every_numeric_config_key_has_a_documented_bound():
    """A new numeric key in ``training.config`` needs a bound here and a line in docs/security.md."""
    from pathlib import Path

    missing = sorted(set(limits.numeric_keys()) - set(limits.PLATFORM_LIMITS))
    assert not missing, f"add these keys to webapp.policy.limits.PLATFORM_LIMITS: {missing}"
    assert not set(limits.PLATFORM_LIMITS) - set(limits.numeric_keys()), "a bound of a key that no longer exists"
    doc = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    undocumented = [key for key in limits.PLATFORM_LIMITS if f"`{key}`" not in doc]
    assert not undocumented, f"docs/security.md does not list the bounds of {undocumented}"


@pytest.mark.parametrize("overrides", [
    ALIAS_BOMB,
    "trainer.logger=[&a [lol, lol, lol], [*a, *a, *a], [*a, *a, *a]]",  # one key=value line's value
    "data.prompt_key=&x lol\ndata.answer_key=*x",
])
def test_yaml_aliases_are_refused_at_once(owner_client, copy_form_data, apply_async, overrides):
    copy_form_data["overrides"] = overrides
    started = time.perf_counter()
    response = owner_client.post(FORM_URL, copy_form_data)
    elapsed = time.perf_counter() - started
    assert "anchors and aliases" in _form_errors(response)["overrides"]
    assert len(response.content) < 200_000, "the page echoes the bomb expanded"
    assert elapsed < 1.0, f"the refusal took {elapsed:.2f} s"
    assert Run.objects.count() == 0


def test_the_alias_bomb_is_350_bytes():
    assert len(ALIAS_BOMB) <= 350


@pytest.mark.parametrize("overrides", ["a: " + "[" * 5000 + "]" * 5000, "trainer.logger=" + "[" * 5000 + "]" * 5000])
def test_deep_nesting_is_refused(owner_client, copy_form_data, apply_async, overrides):
    errors = _form_errors(owner_client.post(FORM_URL, copy_form_data | {"overrides": overrides}))
    assert f"at most {limits.MAX_YAML_DEPTH} levels" in errors["overrides"]


def test_sizes_of_overrides_names_notes_and_tags(owner_client, copy_form_data, apply_async):
    long_key = "x" * 300 + "=1"
    for field, value in (("overrides", "#" * (limits.MAX_OVERRIDES_CHARS + 1)), ("overrides", long_key),
                         ("name", "n" * 201), ("notes", "n" * (limits.MAX_NOTES_CHARS + 1)), ("tags", "t," * 300)):
        errors = _form_errors(owner_client.post(FORM_URL, copy_form_data | {field: value}))
        assert field in errors, (field, errors)
    lines = "\n".join(f"k{i}.x=1" for i in range(limits.MAX_OVERRIDE_KEYS + 1))
    assert "override keys" in _form_errors(owner_client.post(FORM_URL, copy_form_data | {"overrides": lines}))["overrides"]
    assert Run.objects.count() == 0


def test_error_messages_are_capped(owner_client, copy_form_data, apply_async):
    copy_form_data["overrides"] = "algorithm.adv_estimator=" + "x" * 15_000
    response = owner_client.post(FORM_URL, copy_form_data)
    errors = response.context["form"].errors
    assert errors, "the value is not an estimator"
    assert all(len(message) <= limits.MAX_ERROR_CHARS for messages in errors.values() for message in messages)
    # The page grows by the value echoed in its text box and capped messages, not by the value again
    # in each message: measured against the same page refusing a short value.
    short = owner_client.post(FORM_URL, copy_form_data | {"overrides": "algorithm.adv_estimator=x"})
    assert len(response.content) - len(short.content) < 15_000 + 4 * limits.MAX_ERROR_CHARS


def test_api_sizes(api_client, owner, registry, apply_async):
    client = api_client(owner)
    base = {"agent": "copy-task", "dataset": "copy", "reward": "char-accuracy", "backend": "trl", "model": "tiny-char"}
    big = {f"k{i}": "v" * 100 for i in range(300)}
    for field, value in (("overrides", big), ("notes", "n" * (limits.MAX_NOTES_CHARS + 1)), ("name", "n" * 201),
                         ("tags", ["t"] * 51), ("tags", ["t" * 101])):
        response = client.post("/api/runs/", base | {field: value}, format="json")
        assert response.status_code == 400 and field in response.json(), (field, response.content[:300])
    run = Run.objects.create(owner=owner, kind=Run.Kind.EXTERNAL, status=Run.Status.RUNNING)
    response = client.patch(f"/api/runs/{run.pk}/", {"notes": "n" * (limits.MAX_NOTES_CHARS + 1)}, format="json")
    assert response.status_code == 400 and "notes" in response.json()
    assert Run.objects.count() == 1


def test_api_error_messages_are_capped(api_client, owner, db):
    response = api_client(owner).post("/api/runs/", {"kind": "k" * 50_000}, format="json")
    assert response.status_code == 400
    assert len(json.dumps(response.json())) < 2 * limits.MAX_ERROR_CHARS
