"""`harel-beanie check-history`: judge recorded history files, offline.

Why this module exists: a fault run's verdict should not depend on the process that ran it
surviving to the end, nor on its author's assertions. The histories its processes wrote
(`harel_beanie.history`) are judged afterwards, by this command, from the files alone: it
reads and merges them, runs the checker with the final states replayed on harel's in-memory
store (`harel_beanie.history.replay`, over the `--definitions` the run used), prints the
figures and every anomaly, and exits 0 when there is none, 1 otherwise (2: the files or the
definitions could not be read). It needs no database.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from harel_beanie.core.errors import ConfigError

if TYPE_CHECKING:
    from harel_beanie.history.verdict import Verdict

NAME = "check-history"
HELP = "judge recorded history files: nothing lost, nothing doubled"
DESCRIPTION = (
    "Read the history files a run's processes recorded (harel_beanie.history), check that every acknowledged "
    "event was applied once and none twice, that each execution's versions form one chain, that no read went "
    "back in time, that the final states match harel's in-memory replay of the accepted events and that the "
    "work drained. Prints the figures and each anomaly; exit 0 when there is none, 1 otherwise."
)
#: it reads local files only: no server
WHERE = "offline"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("history", nargs="+", metavar="HISTORY", help="a JSON Lines history file (several: merged)")
    p.add_argument(
        "--definitions", metavar="DIR", required=True, help="the *.stm directory the run used (for the replay)"
    )
    p.add_argument(
        "--seen-field",
        default="seen",
        metavar="NAME",
        help="the context field listing the ids of the events applied (default seen)",
    )
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.add_argument(
        "--story",
        action="append",
        default=[],
        metavar="EVENT",
        help="also print this event's records beside the run's faults, in time order (repeatable)",
    )


def main(args: Any) -> int:
    from harel_beanie.commands.worker import load_definitions
    from harel_beanie.history.checker import check
    from harel_beanie.history.records import read_history
    from harel_beanie.history.replay import replay
    from harel_beanie.history.story import story

    definitions = load_definitions(args.definitions)  # the worker's rule: the same one-line refusals
    try:
        records = read_history(args.history)
    except OSError as exc:
        raise ConfigError(f"cannot read the history: {exc}") from None
    except ValueError as exc:  # a line that is not a record, named with its file and number
        raise ConfigError(str(exc)) from None
    verdict = check(records, lambda case: replay(case, definitions), seen=args.seen_field)
    if args.json:
        print(json.dumps({"files": list(args.history), "records": len(records), **verdict.as_dict()}, indent=2))
    else:
        _print(verdict, len(records), len(args.history))
        for event in args.story:
            print(f"the story of event {event!r} (seconds from the first record):")
            for line in story(records, event) or ["  (no record names it)"]:
                print("  " + line)
    return 0 if verdict.ok else 1


def _print(verdict: Verdict, records: int, files: int) -> None:
    f = verdict.figures
    print(f"{records} records from {files} file(s), {f['processes']} processes")
    for op, outcomes in sorted(f["operations"].items()):
        print(f"  {op:<7} " + ", ".join(f"{outcome} {n}" for outcome, n in sorted(outcomes.items())))
    print(
        f"  executions {f['executions']}, events sent {f['events_sent']}, applied {f['events_applied']}, "
        f"final states replayed {f['replayed']} (skipped {f['replay_skipped']})"
    )
    if f["faults"]:
        print("  faults " + ", ".join(f"{kind} {n}" for kind, n in sorted(f["faults"].items())))
    if f["stray_completions"]:
        print(f"  completions with no invoke in the history: {f['stray_completions']}")
    for anomaly in verdict.anomalies:
        print(f"anomaly: {anomaly}")
    print(verdict.summary())
