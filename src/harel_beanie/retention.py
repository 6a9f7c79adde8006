"""Retention (what `harel-beanie prune` removes, its archives, the TTL index) for apps that prune
from their own code. It lives in `harel_beanie.ops.retention`; this module is the public path
to it.
"""

from harel_beanie.ops.archive import (
    Archive,
    ArchiveContents,
    CollectionArchive,
    CorruptLine,
    JsonlArchive,
    Removal,
    read_jsonl,
)
from harel_beanie.ops.retention import (
    FINISHED,
    TTL_INDEX,
    PruneReport,
    candidates_filter,
    dumps_report,
    ensure_ttl,
    parse_age,
    parse_before,
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
