"""Retention: what `harel-beanie prune` and a retaining worker remove (`prune`), where they
put what they remove (`archive`), and `drop_ttl` for the retired TTL index; this package's
face is the public path for apps that prune from their own code.
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
    drop_ttl,
    dumps_report,
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
    "drop_ttl",
    "dumps_report",
]
