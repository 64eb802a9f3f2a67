"""The example rows: ``seed_registry`` makes them, and the tests' ``registry`` fixture makes the same
rows again with a few queries where it has seen ``seed_registry`` start from the same rows."""

from __future__ import annotations

import pytest
from django.db import transaction

from webapp.registry.models import Agent, Backend, Dataset, Model, RewardFunction, Tool
from webapp.registry.seed import AGENTS, BACKENDS, seed_registry


def registry_rows() -> dict:
    """Every registry row by table and name, with every field but its key and creation time, and the
    agents' tools."""
    rows = {}
    for model in (Tool, Agent, Dataset, Model, RewardFunction, Backend):
        fields = [f for f in model._meta.concrete_fields if not f.primary_key and f.name != "created_at"]
        rows[model.__name__] = {row.name: {f.name: f.value_from_object(row) for f in fields} for row in model.objects.all()}
    rows["tools"] = {agent.name: sorted(agent.tools.values_list("name", flat=True)) for agent in Agent.objects.all()}
    return rows


def in_a_savepoint(make) -> tuple:
    """What ``make()`` returns and leaves in the registry, undone afterwards."""
    with transaction.atomic():
        made = make()
        rows = registry_rows()
        transaction.set_rollback(True)
    return made, rows


@pytest.mark.parametrize("start", ["as migrated", "empty"])
def test_the_fixture_makes_the_rows_seed_registry_makes(db, registry_seeding, start):
    if start == "empty":  # as after a transactional test's flush (the migrations leave a tiny-char model)
        Model.objects.all().delete()
    _, seeded = in_a_savepoint(seed_registry)
    in_a_savepoint(registry_seeding.seed)  # seen once (the real seeding, if no earlier test started from here) ...
    assert repr(registry_seeding.rows()) in registry_seeding.outcomes
    _, replayed = in_a_savepoint(registry_seeding.seed)  # ... then made again from what it left
    assert replayed == seeded
    assert set(seeded["Agent"]) == {row["name"] for row in AGENTS}
    assert set(seeded["Backend"]) == {row["name"] for row in BACKENDS}
    assert seeded["tools"]["calculator"] == ["add", "multiply"]


def test_rows_a_test_made_first_are_seeded_by_seed_registry_itself(db, registry_seeding):
    Tool.objects.create(name="mine", path="examples.arithmetic.add")
    Backend.objects.create(name="trl", processor="trl", enabled=False)  # an admin's change, which seeding keeps
    _, rows = in_a_savepoint(registry_seeding.seed)
    assert "mine" in rows["Tool"] and rows["Backend"]["trl"]["enabled"] is False
    assert rows["tools"]["calculator"] == ["add", "multiply"]
