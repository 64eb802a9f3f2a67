"""A few kilobytes of upload must not cost the web process hundreds of megabytes: a Parquet file of
14 KB unpacked to 99 MB of rows, held by the web process after the upload and parsed again on every
view of the mapping page (334 MB resident). Now a child process reads every upload under limits and
writes its rows to a file; the web process keeps a summary (the columns, the first rows, cut) and
streams the rows, line by line, into the dataset's files.

Memory is measured with ``tracemalloc``: every Python allocation of this (the web) process, which is
where the rows were held before (the child's answer, decoded into Python strings)."""

from __future__ import annotations

import html
import io
import json
import subprocess
import tracemalloc
from pathlib import Path
from unittest import mock

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from webapp.registry.forms import ColumnMappingForm
from webapp.registry.models import Dataset, PendingUpload

ROWS, CHARS = 200, 99_000  # 19.8 MB of text, under the cell limit (100,000) and the text limit (5 x 4 MB)


@pytest.fixture(autouse=True)
def _media(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "uploads"
    settings.DATASET_UPLOAD_MAX_BYTES = 4 * 1024 * 1024


@pytest.fixture
def bomb() -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.table({"question": [f"{i:04d}" + "a" * (CHARS - 4) for i in range(ROWS)],
                             "answer": [str(i) for i in range(ROWS)]}), buffer, compression="zstd")
    assert len(buffer.getvalue()) < 20_000
    return buffer.getvalue()


def _peak_of(action) -> int:
    """The most bytes Python allocations of this process held above the start, during ``action``."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        start, _ = tracemalloc.get_traced_memory()
        action()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - start


def _upload_map_and_view(client, project, name: str, filename: str, content: bytes, measure: dict | None = None) -> Dataset:
    """Upload, view the mapping page three times, save, view the dataset's page; with ``measure``,
    the peak of each step in it."""
    def step(what, action):
        peak = _peak_of(lambda: responses.append(action()))
        if measure is not None:
            measure[what] = max(measure.get(what, 0), peak)
        return responses[-1]

    responses = []
    uploaded = step("upload", lambda: client.post(reverse("registry:dataset_upload", args=[project.pk]), {
        "name": name, "description": "", "file": SimpleUploadedFile(filename, content)}))
    assert uploaded.status_code == 302, html.unescape(uploaded.content.decode())[-2000:]
    for _ in range(3):
        assert step("mapping page", lambda: client.get(uploaded["Location"])).status_code == 200
    saved = step("save", lambda: client.post(uploaded["Location"], {"prompt": "question", "ground_truth": "answer",
                                                                     "test_percent": 10}))
    assert saved.status_code == 302, html.unescape(saved.content.decode())[-2000:]
    dataset = Dataset.objects.get(name=name, project=project)
    assert step("dataset page", lambda: client.get(reverse("registry:dataset_detail", args=[dataset.pk]))).status_code == 200
    return dataset


def test_a_small_parquet_file_that_unpacks_to_20_mb_costs_the_web_process_little(page_client, owner, project, bomb, settings):
    client = page_client(owner)
    # Once through every step with a small file first: the first request imports modules and compiles templates.
    _upload_map_and_view(client, project, "warm-up", "small.csv", b"question,answer\n" + b"q,a\n" * 20)

    with mock.patch("webapp.registry.views.ColumnMappingForm", wraps=ColumnMappingForm) as mapping_form, \
            mock.patch("subprocess.run", wraps=subprocess.run) as child:
        peaks: dict[str, int] = {}
        dataset = _upload_map_and_view(client, project, "bomb", "bomb.parquet", bomb, peaks)
    assert child.call_count == 1  # the upload's reader; the mapping page and the save read nothing again
    pending = mapping_form.call_args.kwargs["pending"]
    assert (pending.row_count, pending.columns) == (ROWS, ["question", "answer"])
    assert [len(row[0]) for row in pending.preview] == [200] * 10  # cells are cut for display
    # Before: the upload peaked over 40 MB and each view of the mapping page as much (the rows, as the
    # child's answer and as Python strings); saving and the dataset's page read every row again.
    assert peaks["upload"] < 2_000_000, peaks
    assert peaks["mapping page"] < 500_000, peaks
    assert peaks["save"] < 4_000_000, peaks  # one row (99 KB) at a time, in parts of at most 1 MB
    assert peaks["dataset page"] < 4_000_000, peaks  # the first 10 rows (1 MB), not 20 MB

    train = Path(dataset.file.path).read_text().splitlines()
    test = Path(dataset.test_file.path).read_text().splitlines()
    assert (len(train), len(test)) == (180, 20)
    assert sorted(json.loads(line)["answer"] for line in train + test) == sorted(str(i) for i in range(ROWS))
    assert not PendingUpload.objects.exists() and not any((Path(settings.MEDIA_ROOT) / "datasets" / "pending").iterdir())


def test_rows_beyond_the_text_limit_are_refused_by_the_child_naming_the_limit(page_client, owner, project, bomb, settings):
    settings.DATASET_UPLOAD_MAX_BYTES = 2 * 1024 * 1024  # 10 MB of text at most; the bomb has 19.8 MB
    client = page_client(owner)
    peak = _peak_of(lambda: setattr(client, "answer", client.post(
        reverse("registry:dataset_upload", args=[project.pk]),
        {"name": "bomb", "description": "", "file": SimpleUploadedFile("bomb.parquet", bomb)})))
    page = html.unescape(client.answer.content.decode())
    assert client.answer.status_code == 200
    assert "Row 106: the rows so far unpack to more than 10,485,760 bytes of text (the limit); split the file." in page
    assert peak < 2_000_000
    assert not PendingUpload.objects.exists() and not (Path(settings.MEDIA_ROOT) / "datasets").exists()
