"""Datasets uploaded from the browser: CSV, JSONL and Parquet, a preview, a column mapping, a
train/test split, stored under names the platform makes up, seen by the project's team only, and
usable in the run form. Bad files are refused naming the row and the column."""

from __future__ import annotations

import html
import io
import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils import timezone

from webapp.registry.models import Dataset, PendingUpload

CSV = "question,answer,source\n" + "".join(f"what is {i}+{i}?,{2 * i},book\n" for i in range(20))


@pytest.fixture(autouse=True)
def _media(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "uploads"
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def text(response) -> str:
    return html.unescape(response.content.decode())


def upload(client, project, name: str, filename: str, content: bytes):
    return client.post(reverse("registry:dataset_upload", args=[project.pk]),
                       {"name": name, "description": "", "file": SimpleUploadedFile(filename, content)})


def upload_and_map(client, project, name="sums", filename="sums.csv", content=CSV.encode(), **mapping):
    response = upload(client, project, name, filename, content)
    assert response.status_code == 302, response.content.decode()[-2000:]
    preview = client.get(response["Location"])
    data = {"prompt": "question", "ground_truth": "answer", "test_percent": 25, **mapping}
    return preview, client.post(response["Location"], data)


def test_a_csv_upload_previews_maps_splits_and_is_stored_under_a_made_up_name(page_client, owner, project, settings):
    client = page_client(owner)
    preview, saved = upload_and_map(client, project, filename="../../../etc/evil.csv")
    text = preview.content.decode()
    assert "what is 0+0?" in text and "20 rows" in text and "<th>source</th>" in text
    assert 'value="question" selected' in text  # the prompt column is guessed from its name

    dataset = Dataset.objects.get(name="sums")
    assert saved.status_code == 302 and saved["Location"].startswith(reverse("runs:create") + f"?dataset={dataset.pk}")
    assert dataset.project == project and dataset.source == Dataset.Source.UPLOAD
    assert dataset.column_mapping == {"prompt": "question", "ground_truth": "answer"}
    assert dataset.config_overrides() == {"data.prompt_key": "question", "data.answer_key": "answer"}
    train = [json.loads(line) for line in Path(dataset.file.path).read_text().splitlines()]
    test = [json.loads(line) for line in Path(dataset.test_file.path).read_text().splitlines()]
    assert (len(train), len(test)) == (15, 5)
    assert sorted(r["question"] for r in train + test) == sorted(f"what is {i}+{i}?" for i in range(20))
    for stored in (dataset.file, dataset.test_file):  # the browser's name is never a path
        assert Path(stored.path).resolve().is_relative_to(Path(settings.MEDIA_ROOT).resolve() / "datasets")
        assert "evil" not in stored.name and ".." not in stored.name
    kwargs = dataset.trainer_kwargs()
    assert (kwargs["train_dataset"], kwargs["val_dataset"]) == (dataset.file.path, dataset.test_file.path)
    assert not list((Path(settings.MEDIA_ROOT) / "datasets" / "pending").iterdir())  # the raw upload is gone


def test_jsonl_and_parquet_uploads(page_client, owner, project):
    import pyarrow as pa
    import pyarrow.parquet as pq

    client = page_client(owner)
    jsonl = "".join(json.dumps({"prompt": f"p{i}", "ground_truth": f"g{i}", "meta": {"i": i}}) + "\n" for i in range(6))
    upload_and_map(client, project, name="from-jsonl", filename="rows.jsonl", content=jsonl.encode(),
                   prompt="prompt", ground_truth="ground_truth", test_percent=0)
    dataset = Dataset.objects.get(name="from-jsonl")
    assert not dataset.test_file and dataset.val_split == "" and dataset.trainer_kwargs()["val_dataset"] is None
    assert json.loads(Path(dataset.file.path).read_text().splitlines()[0])["meta"] == {"i": 0}

    buffer = io.BytesIO()
    pq.write_table(pa.table({"q": [f"q{i}" for i in range(8)], "a": list(range(8))}), buffer)
    upload_and_map(client, project, name="from-parquet", filename="rows.parquet", content=buffer.getvalue(),
                   prompt="q", ground_truth="a", test_percent=50)
    dataset = Dataset.objects.get(name="from-parquet")
    assert len(Path(dataset.file.path).read_text().splitlines()) == 4
    assert len(Path(dataset.test_file.path).read_text().splitlines()) == 4


@pytest.mark.parametrize("filename, content, expected", [
    ("bad.csv", b"question,answer\nq1,a1\nq2,a2,extra\n", "Row 2 (line 3): 3 field(s), but the header has 2"),
    ("bad.csv", b"question,question\nq1,a1\n", "column 'question' appears twice"),
    ("bad.csv", b"question,answer\nq1,\xff\xfe\n", "not UTF-8"),
    ("bad.jsonl", b'{"prompt": "a"}\n{"prompt": \n', "Row 2 (line 2): not valid JSON"),
    ("bad.jsonl", b'{"prompt": "a"}\n[1, 2]\n', "Row 2 (line 2): a JSON list, not an object"),
    ("bad.parquet", b"PAR1 not really", "Not a readable Parquet file"),
    ("rows.xlsx", b"whatever", "upload a .csv, .jsonl or .parquet file"),
    ("empty.csv", b"", "The submitted file is empty"),
    ("blank.csv", b"\n\n", "The CSV file is empty"),
])
def test_bad_files_are_refused_naming_row_and_column(page_client, owner, project, filename, content, expected):
    response = upload(page_client(owner), project, "bad", filename, content)
    assert response.status_code == 200
    assert expected in text(response)
    assert not Dataset.objects.filter(name="bad").exists()


def test_an_empty_prompt_cell_is_named_by_row_and_column(page_client, owner, project):
    content = b"question,answer\nq1,1\n,2\nq3,3\n"
    _, response = upload_and_map(page_client(owner), project, name="holes", content=content, test_percent=0)
    assert response.status_code == 200
    assert "Row 2 (line 3), column 'question': empty, but it is the prompt column" in text(response)
    assert not Dataset.objects.filter(name="holes").exists()


def test_limits_from_settings(page_client, owner, project, settings):
    client = page_client(owner)
    settings.DATASET_UPLOAD_MAX_ROWS = 5
    assert "More than 5 rows" in upload(client, project, "big", "big.csv", CSV.encode()).content.decode()
    settings.DATASET_UPLOAD_MAX_BYTES = 1024
    response = upload(client, project, "big", "big.csv", b"a,b\n" + b"x,y\n" * 1000)
    assert "larger than the limit of 1,024 bytes" in response.content.decode()
    assert not (Path(settings.MEDIA_ROOT) / "datasets").exists()  # nothing of it was kept
    settings.DATASET_UPLOAD_MAX_CELL_CHARS = 100
    response = upload(client, project, "big", "big.csv", b"a,b\nx," + b"y" * 200 + b"\n")
    assert "Row 1 (line 2), column 'b': the value has more than 100 characters" in text(response)


def test_only_the_projects_team_sees_it_and_only_non_viewers_upload(page_client, owner, teammate, viewer, stranger, project):
    upload_and_map(page_client(owner), project)
    dataset = Dataset.objects.get(name="sums")
    detail = reverse("registry:dataset_detail", args=[dataset.pk])
    assert "what is" in page_client(teammate).get(detail).content.decode()
    assert page_client(viewer).get(detail).status_code == 200
    assert page_client(stranger).get(detail).status_code == 404
    assert page_client(stranger).get(reverse("registry:project", args=[project.pk])).status_code == 404
    assert upload(page_client(stranger), project, "x", "x.csv", CSV.encode()).status_code == 404
    assert upload(page_client(viewer), project, "x", "x.csv", CSV.encode()).status_code == 404
    # Another person's session cannot finish (or see) an upload waiting for its columns.
    pending = upload(page_client(owner), project, "mine", "x.csv", CSV.encode())["Location"]
    assert page_client(teammate).get(pending).status_code == 404

    from webapp.runs.forms import RunForm

    assert dataset in RunForm(user=teammate).fields["dataset"].queryset
    assert dataset not in RunForm(user=stranger).fields["dataset"].queryset


def test_a_run_starts_from_an_uploaded_dataset(page_client, owner, project, registry, no_queue):
    from webapp.runs.models import Run

    client = page_client(owner)
    content = "text,copy\n" + "".join(f"ab{i},ab{i}\n" for i in range(8))
    _, saved = upload_and_map(client, project, name="copies", content=content.encode(), prompt="text",
                              ground_truth="copy", test_percent=25)
    form_page = client.get(saved["Location"]).content.decode()
    dataset = Dataset.objects.get(name="copies")
    assert f'<option value="{dataset.pk}" selected>' in form_page
    response = client.post(reverse("runs:create"), {
        "project": project.pk, "visibility": "team", "agent": registry["agents"]["copy-task"].pk,
        "dataset": dataset.pk, "reward": registry["rewards"]["exact-match"].pk, "backend": registry["backends"]["trl"].pk,
        "model": "tiny-char", "overrides": "trainer.total_training_steps=1\ndata.train_batch_size=2\nactor_rollout_ref.rollout.n=2\n",
    })
    assert response.status_code == 302, response.content.decode()[-3000:]
    run = Run.objects.get(dataset=dataset)
    assert run.project == project


def test_a_parquet_file_that_unpacks_far_beyond_its_bytes_is_refused(page_client, owner, project, settings):
    """A few kilobytes of Parquet can hold hundreds of megabytes: read in a child under limits."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    client = page_client(owner)
    settings.DATASET_UPLOAD_MAX_BYTES = 10_000  # rows may unpack to 5x: 50,000 bytes
    buffer = io.BytesIO()
    pq.write_table(pa.table({"q": ["a" * 1000] * 100}), buffer, compression="zstd")  # 1,010 bytes a row as JSON
    assert len(buffer.getvalue()) < 10_000
    response = upload(client, project, "bomb", "bomb.parquet", buffer.getvalue())
    assert "Row 50: the rows so far unpack to more than 50,000 bytes of text (the limit)" in text(response)
    buffer = io.BytesIO()
    pq.write_table(pa.table({"q": ["a" * (1 << 20)]}), buffer, compression="zstd")
    response = upload(client, project, "bomb", "bomb.parquet", buffer.getvalue())
    assert "Row 1, column 'q': the value has more than 100,000 characters (the limit)" in text(response)
    assert not Dataset.objects.filter(name="bomb").exists()


@pytest.mark.slow
def test_a_parquet_value_that_needs_more_memory_than_the_reader_may_use_is_refused(page_client, owner, project, settings):
    """A memory bomb: one value that unpacks past the child's memory limit."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    client = page_client(owner)
    settings.DATASET_UPLOAD_MAX_BYTES = 20 * 1024 * 1024
    settings.DATASET_PARSE_MEMORY_MB = 64  # one 150 MB value does not fit
    buffer = io.BytesIO()
    pq.write_table(pa.table({"q": ["a" * (150 << 20)]}), buffer, compression="zstd")
    response = upload(client, project, "bomb", "bomb.parquet", buffer.getvalue())
    assert "Row 1: reading it needs more than 64 MB of memory (the limit)" in text(response)
    assert not Dataset.objects.filter(name="bomb").exists()


def test_abandoned_uploads_are_pruned_and_a_deleted_dataset_takes_its_files(page_client, owner, project, settings):
    client = page_client(owner)
    upload(client, project, "abandoned", "a.csv", CSV.encode())  # never mapped
    pending = Path(settings.MEDIA_ROOT) / "datasets" / "pending"
    (left,) = pending.iterdir()
    PendingUpload.objects.update(created_at=timezone.now() - timedelta(hours=25))
    upload_and_map(client, project)
    assert not left.exists() and not PendingUpload.objects.filter(name="abandoned").exists()  # the next upload pruned it

    dataset = Dataset.objects.get(name="sums")
    files = [Path(dataset.file.path), Path(dataset.test_file.path)]
    assert all(f.exists() for f in files)
    dataset.delete()
    assert not any(f.exists() for f in files)


def test_the_upload_form_still_checks_csrf(owner, project, settings):
    """The view reads its body itself (to stop an oversized file early), so it checks CSRF itself."""
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    response = upload(client, project, "forged", "x.csv", CSV.encode())
    assert response.status_code == 403
    assert not (Path(settings.MEDIA_ROOT) / "datasets").exists()


def test_members_delete_entries_no_run_uses(page_client, owner, teammate, viewer, stranger, project, make_run):
    upload_and_map(page_client(owner), project)
    dataset = Dataset.objects.get(name="sums")
    url = reverse("registry:entry_delete", args=["datasets", dataset.pk])
    assert page_client(stranger).post(url).status_code == 404
    assert page_client(viewer).post(url).status_code == 404
    run = make_run(dataset=dataset, project=project)
    page = page_client(teammate).post(url, follow=True)
    assert "sums stays: 1 run used it" in text(page) and Dataset.objects.filter(pk=dataset.pk).exists()
    run.delete()
    page_client(teammate).post(url)
    assert not Dataset.objects.filter(pk=dataset.pk).exists()
    shared = Dataset.objects.create(name="shared", identifier="copy")  # no project: the administrators' own
    assert page_client(owner).post(reverse("registry:entry_delete", args=["datasets", shared.pk])).status_code == 404


def test_a_storage_without_local_paths_gives_workers_a_fetched_copy(page_client, owner, project, settings, tmp_path):
    """Like an object store, Django's in-memory storage keeps files by name, none of them on this disk."""
    from django.core.files.storage import default_storage

    settings.STORAGES = {**settings.STORAGES, "default": {"BACKEND": "django.core.files.storage.InMemoryStorage"}}
    settings.VAR_DIR = tmp_path / "var"
    upload_and_map(page_client(owner), project)
    dataset = Dataset.objects.get(name="sums")
    assert not Path(dataset.file.path).exists()  # a name the storage makes up, no file there
    kwargs = dataset.trainer_kwargs()
    copies = tmp_path / "var" / "stored-files"
    assert Path(kwargs["train_dataset"]) == copies / dataset.file.name
    assert Path(kwargs["val_dataset"]) == copies / dataset.test_file.name
    with default_storage.open(dataset.file.name, "rb") as stored:
        content = stored.read()
    assert Path(kwargs["train_dataset"]).read_bytes() == content and len(content.splitlines()) == 15
