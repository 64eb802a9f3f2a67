"""The runs table: the columns a person adds (a metric's latest, highest or lowest value; a config
key), the sort and the grouping. Sorting is the database's (``ORDER BY`` on the run row's JSON
columns), so a page of a thousand runs is the right page; no metric point is read: the latest value
and each key's range are kept on the run's row by the metric store (``Run.latest_values``,
``Run.value_ranges``).

Ids, as the URL and the saved view carry them: ``metric:<key>:latest|max|min``, ``config:<dotted
key>``, or a built-in column (``created``, ``steps``, ``name``, ...). A sort is a column id,
``-`` in front for descending; a grouping is ``tag``, a registry choice (``agent`` ...) or a
``config:<key>``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from django.db.models import F, FloatField, JSONField, QuerySet
from django.db.models.expressions import Expression
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Cast, Coalesce

from training.config import flatten

AGGREGATES = {"latest": "latest", "max": "highest", "min": "lowest"}
MAX_COLUMNS = 12
MAX_KEY_LENGTH = 200
# Built-in columns one may sort by: the run row's field, and the direction a first click sorts in.
BUILTIN_SORTS = {
    "id": ("pk", "-"), "name": ("name", ""), "status": ("status", ""), "agent": ("agent__name", ""),
    "dataset": ("dataset__name", ""), "backend": ("backend__name", ""), "created": ("created_at", "-"),
    "steps": ("steps", "-"),
}
DEFAULT_SORT = "-created"
# Groupings besides a config key: what each reads from the row.
BUILTIN_GROUPS = {
    "tag": "tags", "agent": "agent__name", "dataset": "dataset__name", "reward": "reward__name", "model": "model",
    "backend": "backend__name", "status": "status", "project": "project__name",
}


class BadColumn(ValueError):
    """A column, sort or grouping the table does not know; the message says what was wrong."""


@dataclass(frozen=True)
class Column:
    kind: str  # "metric" or "config"
    key: str
    aggregate: str = ""  # a metric's: latest, max or min

    @property
    def id(self) -> str:
        return f"metric:{self.key}:{self.aggregate}" if self.kind == "metric" else f"config:{self.key}"

    @property
    def label(self) -> str:
        return f"{self.key} ({AGGREGATES[self.aggregate]})" if self.kind == "metric" else self.key

    @property
    def first_direction(self) -> str:
        """The direction a first click on the header sorts in: the best first."""
        return "" if self.aggregate == "min" or self.kind == "config" else "-"

    def expression(self) -> Expression:
        if self.kind == "config":
            return config_expression(self.key)
        if self.aggregate == "latest":
            return Cast(KeyTextTransform(self.key, "latest_values"), FloatField())
        return Cast(KeyTextTransform(self.aggregate, KeyTransform(self.key, "value_ranges")), FloatField())

    def value_of(self, run, config: dict[str, Any]) -> Any:
        """This column's value for ``run`` (``config``: its flat config, ``run_config``)."""
        if self.kind == "config":
            return config.get(self.key)
        if self.aggregate == "latest":
            return (run.latest_values or {}).get(self.key)
        return ((run.value_ranges or {}).get(self.key) or {}).get(self.aggregate)


def parse_column(text: str) -> Column:
    kind, _, rest = text.partition(":")
    if kind == "metric":
        key, _, aggregate = rest.rpartition(":")
        if aggregate not in AGGREGATES:
            raise BadColumn(f"A metric column is metric:<key>:latest, :max or :min; got {text!r}.")
        column = Column("metric", key, aggregate)
    elif kind == "config":
        column = Column("config", rest)
    else:
        raise BadColumn(f"Unknown column {text!r}: a column is metric:<key>:latest|max|min or config:<key>.")
    if not column.key or len(column.key) > MAX_KEY_LENGTH:
        raise BadColumn(f"A column's key has 1 to {MAX_KEY_LENGTH} characters; got {len(column.key)}.")
    return column


def parse_columns(ids: list[str]) -> list[Column]:
    """A saved view's columns, leaving out any this version no longer reads."""
    columns = []
    for text in ids:
        try:
            columns.append(parse_column(text))
        except BadColumn:
            continue
    return columns


def config_expression(key: str) -> Expression:
    """A config key's value: in the final config (nested, as the run started with it), else in
    the overrides its owner entered (flat dotted keys) for a run that has not started."""
    return Coalesce(*_config_places(key), output_field=JSONField())


def _config_places(key: str) -> tuple[KeyTransform, KeyTransform]:
    nested = "final_config"
    for part in key.split("."):
        nested = KeyTransform(part, nested)
    return nested, KeyTransform(key, "config_overrides")


def run_config(run) -> dict[str, Any]:
    """A run's flat config: the final config when it started, else its overrides."""
    if run.final_config:  # the keys said to change nothing on the run's backend are no column of their own
        return flatten({key: value for key, value in run.final_config.items() if key != "ignored_keys"})
    return dict(run.config_overrides or {})


@dataclass(frozen=True)
class Sort:
    column_id: str
    descending: bool
    expression: Any  # an expression or a field name

    def order_by(self) -> list:
        value = F(self.expression) if isinstance(self.expression, str) else self.expression
        ordered = value.desc(nulls_last=True) if self.descending else value.asc(nulls_last=True)
        return [ordered, "-pk"]


def parse_sort(text: str) -> Sort:
    descending = text.startswith("-")
    column_id = text.lstrip("-")
    if column_id in BUILTIN_SORTS:
        return Sort(column_id, descending, BUILTIN_SORTS[column_id][0])
    try:
        column = parse_column(column_id)
    except BadColumn as exc:
        known = ", ".join(BUILTIN_SORTS)
        raise BadColumn(f"Cannot sort by {column_id!r}: sort by {known}, metric:<key>:latest|max|min or config:<key>.") from exc
    return Sort(column.id, descending, column.expression())


def header_sort(current: Sort, column_id: str, first_direction: str) -> str:
    """The sort a click on a column's header asks for: the other direction when the table is
    sorted by that column already, else the column's own first direction."""
    if current.column_id == column_id:
        return ("" if current.descending else "-") + column_id
    return first_direction + column_id


def parse_group(text: str) -> str:
    if not text or text in BUILTIN_GROUPS:
        return text
    if text.startswith("config:") and 0 < len(text) - 7 <= MAX_KEY_LENGTH:
        return text
    raise BadColumn(f"Cannot group by {text!r}: group by {', '.join(BUILTIN_GROUPS)} or config:<key>.")


def available_keys(runs: QuerySet, shown: list) -> tuple[list[str], list[str]]:
    """The metric keys and config keys to offer for ``runs`` (the runs listed, so only what their
    reader may see): every metric key they logged; every config key their owners set, and every key
    of the final configs of the runs ``shown`` on the page. Flattening a thousand final configs (126
    keys each) took a quarter of a second a page; the keys left out are the defaults those shown
    share with the rest, unless a config schema changed between the runs listed."""
    metric_keys: set[str] = set()
    config_keys: set[str] = set()
    for latest, overrides in runs.values_list("latest_values", "config_overrides").order_by():
        metric_keys.update(latest or {})
        config_keys.update(overrides or {})
    for run in shown:
        config_keys.update(run_config(run))
    return sorted(metric_keys), sorted(config_keys)


def has_key(runs: QuerySet, column: Column) -> bool:
    """Whether some run of ``runs`` has ``column``'s key (a metric it logged, a key of its config)."""
    if column.kind == "metric":
        return runs.filter(latest_values__has_key=column.key).exists()
    return runs.alias(value=config_expression(column.key)).filter(value__isnull=False).exists()


def group_values(runs: QuerySet, group: str) -> list[tuple[int, Any]]:
    """``runs`` as ``(pk, group value)`` pairs."""
    if group.startswith("config:"):
        # Read from both places and chosen here: SQLite hands a COALESCE of JSON back as a plain
        # number, which a JSON field would try to decode again.
        final, override = _config_places(group[7:])
        pairs = runs.annotate(final=final, override=override).values_list("pk", "final", "override")
        return [(pk, override if value is None else value) for pk, value, override in pairs]
    return list(runs.values_list("pk", BUILTIN_GROUPS[group]))


def group_label(value: Any) -> str:
    if value is None or value == "":
        return "(none)"
    return value if isinstance(value, str) else json.dumps(value)


def grouped(pairs: list[tuple[int, Any]], group: str) -> list[tuple[str, list[int]]]:
    """Runs (``(pk, value)`` pairs, in the table's order) under each group's label, groups in order
    of their value, "(none)" last. Grouped by tag, a run with two tags is in both groups."""
    groups: dict[Any, list[int]] = {}
    for pk, value in pairs:
        values = (value or [None]) if group == "tag" else [value]
        for one in values:
            groups.setdefault(json.dumps(one, sort_keys=True), []).append(pk)
    order = sorted(groups, key=lambda text: (text == "null", _sort_key(json.loads(text))))
    return [(group_label(json.loads(text)), groups[text]) for text in order]


def _sort_key(value: Any) -> tuple:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value, "")
    return (1, 0, group_label(value))


def mean(values: list) -> float | None:
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    return sum(numbers) / len(numbers) if numbers else None


def shown(value: Any) -> str:
    """A cell's text: numbers to four significant digits, structures as JSON, nothing as a dash."""
    if value is None or value == "":
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)
