"""A LoRA run's saved model is an adapter: the playground answers with its base model and the
adapter merged, refuses an adapter that names a base outside the run and the model roots, and
a new run may start from it (run:<id>)."""

from __future__ import annotations

import shutil

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from training.rollouts.models import adapter_base
from training.rollouts.tiny import save_tiny_model
from webapp.playground.models import PlaygroundRequest
from webapp.runs.models import Run
from webapp.runs.trainer_args import model_config
from workers.playground import answer_request

committed = pytest.mark.django_db(transaction=True)


def save_adapter(base_dir, folder) -> None:
    """An adapter on the tiny model at ``base_dir`` with random (not zero) weights, saved as a trl LoRA run saves one."""
    save_tiny_model(base_dir, seed=3)
    base = AutoModelForCausalLM.from_pretrained(str(base_dir.resolve()))
    torch.manual_seed(0)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(folder)


@pytest.fixture
def lora_run(make_run):
    run = make_run(status=Run.Status.SUCCEEDED, steps=2)
    folder = run.folder()
    save_adapter(folder / "base_model", folder / "final_model")
    Run.objects.filter(pk=run.pk).update(run_path=str(folder))
    run.refresh_from_db()
    yield run
    shutil.rmtree(folder, ignore_errors=True)


def greedy(model, tokenizer, prompt: str, max_new_tokens: int) -> str:
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.eval().generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                    do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def ask(run, **fields) -> PlaygroundRequest:
    return PlaygroundRequest.objects.create(
        run=run, user=run.owner, queue=run.backend.queue, model_name="final_model", kind="chat",
        messages=[{"role": "user", "content": "hello there"}], max_new_tokens=6, temperature=0, **fields)


@committed
def test_the_playground_answers_with_the_base_and_the_adapter_merged(lora_run):
    final = lora_run.folder() / "final_model"
    tokenizer = AutoTokenizer.from_pretrained(final)
    base = AutoModelForCausalLM.from_pretrained(lora_run.folder() / "base_model")
    merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(lora_run.folder() / "base_model"), final).merge_and_unload()
    # The adapter changes what the model says: an answer from the base alone would differ.
    assert greedy(base, tokenizer, "hello there", 6) != greedy(merged, tokenizer, "hello there", 6)

    asked = ask(lora_run)
    assert answer_request(asked.pk, "test-worker@here") == "succeeded"
    asked.refresh_from_db()
    assert asked.reply == greedy(merged, tokenizer, "hello there", 6)


@committed
def test_an_adapter_naming_a_base_outside_the_run_and_the_model_roots_is_refused(lora_run, tmp_path):
    final = lora_run.folder() / "final_model"
    shutil.rmtree(final)
    save_adapter(tmp_path / "elsewhere", final)
    assert adapter_base(final) == str((tmp_path / "elsewhere").resolve())
    asked = ask(lora_run)
    assert answer_request(asked.pk, "test-worker@here") == "failed"
    asked.refresh_from_db()
    assert "neither in the run's folder nor a registered model" in asked.error


@pytest.mark.django_db
def test_a_run_may_start_from_a_lora_runs_adapter(lora_run):
    keys = model_config(f"run:{lora_run.pk}", lora_run.owner)
    assert keys["actor_rollout_ref.model.path"] == str(lora_run.folder() / "final_model")


@pytest.mark.django_db
def test_a_run_may_not_start_from_an_adapter_naming_a_base_outside_the_run(lora_run, tmp_path):
    final = lora_run.folder() / "final_model"
    shutil.rmtree(final)
    save_adapter(tmp_path / "elsewhere", final)
    with pytest.raises(ValueError, match="neither in the run's folder nor a registered model"):
        model_config(f"run:{lora_run.pk}", lora_run.owner)


@committed
def test_a_downloaded_adapter_comes_with_the_base_it_was_trained_on(lora_run, owner_client, tmp_path, monkeypatch):
    """The adapter's base (built in the run's folder) travels in the archive; unpacked anywhere, peft loads it
    and gives the same weights as the platform's own loader."""
    import io
    import tarfile

    from peft import AutoPeftModelForCausalLM
    from test_run_page import body

    from training.rollouts.models import load_trained

    response = owner_client.get(f"/runs/{lora_run.pk}/models/final_model.tar.gz")
    assert response.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(body(response)), mode="r:gz") as tar:
        tar.extractall(tmp_path, filter="data")
    arc = f"run-{lora_run.pk}-final_model"
    assert (tmp_path / arc / "base_model" / "config.json").is_file()
    assert adapter_base(tmp_path / arc) == f"{arc}/base_model"
    monkeypatch.chdir(tmp_path)  # where the archive was unpacked
    loaded = AutoPeftModelForCausalLM.from_pretrained(arc).merge_and_unload()
    expected, _ = load_trained(lora_run.folder() / "final_model")
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in expected.state_dict().items())


@committed
def test_an_adapter_naming_a_folder_outside_the_run_downloads_without_it(lora_run, owner_client, tmp_path):
    """adapter_config.json is written where the run's code runs: a base it names outside the run's folder
    (here another folder on the server) is never put in the archive."""
    import io
    import json
    import tarfile

    from test_run_page import body

    elsewhere = tmp_path / "secret_model"
    elsewhere.mkdir()
    (elsewhere / "config.json").write_text("{}")
    config_file = lora_run.folder() / "final_model" / "adapter_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "base_model_name_or_path": str(elsewhere)}))

    response = owner_client.get(f"/runs/{lora_run.pk}/models/final_model.tar.gz")
    with tarfile.open(fileobj=io.BytesIO(body(response)), mode="r:gz") as tar:
        names = tar.getnames()
    assert f"run-{lora_run.pk}-final_model/adapter_config.json" in names
    assert not any("base_model" in name or "secret_model" in name for name in names), names
