"""Retention: what `harel-beanie prune` removes (`prune`), where it puts what it removes
(`archive`), and the TTL index; this package's face is the public path for apps that prune
from their own code.
"""

from harel_beanie.core.ages import parse_age, parse_before
from harel_beanie.retention.archive import (
    Archive,
    ArchiveContents,
    CollectionArchive,
    CorruptLine,
    JsonlArchive,
    Removal,
    read_jsonl,
)
from harel_beanie.retention.pruning import (
    FINISHED,
    TTL_INDEX,
    PruneReport,
    candidates_filter,
    dumps_report,
    ensure_ttl,
    prune,
)

__all__ = [
    "FINISHED",
    "TTL_INDEX",
    "parse_age",
    "parse_before",
    "PruneReport",
    "Archive",
    "JsonlArchive",
    "CollectionArchive",
    "ArchiveContents",
    "CorruptLine",
    "Removal",
    "read_jsonl",
    "candidates_filter",
    "prune",
    "ensure_ttl",
    "dumps_report",
]
