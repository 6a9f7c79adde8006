"""The `harel-beanie worker` command on the crash tests' shared clock.

    python -m tests.support.crash_worker CLOCK_FILE [harel-beanie worker flags...]

runs `harel-beanie worker` — the command line, its settings, its store and transport, its
start-up and periodic relay sweeps, its ready line and signal handling — with one change:
harel's `AsyncWorker` and the transport take the time from the clock file the test writes
(`tests/support/crash_clock.py`) instead of the wall clock, and the relay sweeps take the
worker's. The command has no clock option, so this script puts the clock into the two places
the command's `Worker` builds them (`open_transport`, `CountingWorker` in `harel_beanie.deploy.worker`),
then runs the command unchanged. That way the models' long timers fire within seconds, every incarnation of the
worker agrees on the time, and `--visibility` is in clock seconds.
"""

from __future__ import annotations

import sys
from typing import Any

from harel_beanie.commands import cli
from harel_beanie.deploy import worker as command
from tests.support.crash_clock import SharedClock

PATCHED = ("open_transport", "CountingWorker")


def use_clock(clock: SharedClock) -> None:
    missing = [name for name in PATCHED if not hasattr(command, name)]
    if missing:
        raise SystemExit(f"harel_beanie.deploy.worker no longer has {missing}: update tests/support/crash_worker.py")
    open_transport, counting_worker = (getattr(command, name) for name in PATCHED)

    # the transport's and the worker's clock replaced (the command passes its own since the
    # worker's clock seam: this one wins); its partition leases keep the real clock
    async def clocked_open_transport(*args: Any, **kwargs: Any) -> Any:
        return await open_transport(*args, **{**kwargs, "clock": clock})

    class ClockedWorker(counting_worker):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "clock": clock})

    command.open_transport = clocked_open_transport  # type: ignore[assignment]
    command.CountingWorker = ClockedWorker  # type: ignore[misc]


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit(__doc__)
    use_clock(SharedClock(argv[0]))
    return cli.main(["worker", *argv[1:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
