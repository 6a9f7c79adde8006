"""Recorded histories of store and transport operations, and the checker that judges them.

Why this package exists: a fault test that asserts what it expects, scenario by scenario,
proves only what its author thought of. Here every process of a run (workers, the client
that sends events) writes each operation it makes to a JSON Lines history: when it was
invoked, and whether it completed ok, failed definitely, or ended unknown (a timed-out
write may still have landed). Once the faults have healed and the work has drained, the
final state of every execution is appended, and `check` decides from the files alone
whether anything was lost, doubled, skipped, read stale or taken out of order.

- `records.py` — the record format (one JSON object a line), `HistoryWriter`, `read_history`
  and the pairing of an invoke with its completion;
- `recording.py` — `RecordingStore` and `RecordingTransport`, any harel async store or
  transport with its operations recorded;
- `checker.py` — `check(records, replay=None) -> Verdict`: the rules, with no I/O;
- `verdict.py` — `Verdict` and `Anomaly`: what was found, and the figures of the history;
- `story.py` — `story(records, event)`: one event's records beside the faults of the run,
  in time order (what a failed run prints, so one failure is enough to start from).

The replay the checker compares final states with (harel's in-memory store running the
accepted events) is on the operations side, `harel_beanie.history.replay`, as is the
`harel-beanie check-history` command.
"""

from harel_beanie.history.checker import Replay, ReplayCase, check
from harel_beanie.history.recording import RecordingStore, RecordingTransport
from harel_beanie.history.records import HistoryWriter, Operation, pair, read_history
from harel_beanie.history.story import stories, story
from harel_beanie.history.verdict import KINDS, Anomaly, Verdict

__all__ = [
    "KINDS",
    "Anomaly",
    "HistoryWriter",
    "Operation",
    "RecordingStore",
    "RecordingTransport",
    "Replay",
    "ReplayCase",
    "Verdict",
    "check",
    "pair",
    "read_history",
    "stories",
    "story",
]
