"""The counts' schema: one document per partition holding its executions' counts, kept up to
date by folds (`harel_beanie.core.counting` states the rules), in `<prefix>_hb_counts`.

Why this module exists: the executions' documents (`harel_beanie.core.documents`) carry what each
one is counted as; the counters are a collection of their own, beside them, declared here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Optional

from beanie import Document
from harel.engine.schema import DEFAULT_PREFIX, Names
from pydantic import ConfigDict, Field

from harel_beanie.core.arguments import require_str
from harel_beanie.core.documents import bound_class


class CountsDocument(Document):
    """One partition's execution counts, kept up to date by folds (`harel_beanie.core.counting`
    states the rules): `_id` the partition; `n` executions by definition and status (keys
    escaped: `core.counting.definition_key`), `t` tombstones (a counter written before the
    counts stopped counting versions may still hold `v`, their sum: read by nothing); `seq` the batches applied, `last` the last one (each id and what it is counted as now),
    `marked` whether its documents carry that, `built` whether the counter holds the
    partition's documents written before it existed; `low` the smallest id the partition
    has held (where a first page may start: `harel_beanie.queries.parts`)."""

    model_config = ConfigDict(extra="allow")

    id: int = Field(alias="_id")  # type: ignore[assignment]
    part: int
    seq: int = 0
    n: dict[str, dict[str, int]] = {}
    t: int = 0
    last: list[dict[str, Any]] = []
    marked: bool = False
    built: bool = False
    low: Optional[str] = None

    class Settings:
        name = f"{DEFAULT_PREFIX}_hb_counts"
        use_state_management = False


def counts_collection(prefix: str) -> str:
    """The collection of the counts of the executions under `prefix`."""
    return f"{require_str('prefix', prefix)}_hb_counts"


def bind_counts(prefix: str = DEFAULT_PREFIX) -> type[CountsDocument]:
    """`CountsDocument` bound to the collection of `prefix` (as `bind`)."""
    return _bind_counts(require_str("prefix", prefix))


@lru_cache(maxsize=None)
def _bind_counts(prefix: str) -> type[CountsDocument]:
    Names(prefix)  # raises ValueError on a prefix harel would refuse
    if prefix == DEFAULT_PREFIX:
        return CountsDocument
    return bound_class(CountsDocument, prefix, counts_collection(prefix))  # type: ignore[no-any-return]
