"""Faults over a real network, and a recorded history that a checker proves: nothing lost,
nothing doubled.

The other fault tests inject faults from inside the conversation (fail points, lost replies
simulated in the driver layer). These put the network itself between the workers and the
server: each worker, the real `harel-beanie worker` command (harel's `AsyncWorker` on this
package's store), runs in a network namespace of its own, the server in another, and the
faults are nft rules on those links (partitions both ways, half-open links, a random share
of packets dropped, links taken down), a userspace proxy on the path (replies later than
the drivers' timeouts, writes run twice, writes reordered across connections, streams cut
mid-message), and the server itself (paused with SIGSTOP longer than a lease, restarted on
its data, stepped down with no primary, fail points closing connections, blocking them
past the socket timeout, returning retryable error labels and write-concern errors), with
workers SIGKILLed and started again on top. Where namespaces cannot be made the same runs
happen on loopback, the proxy standing in for nft; each run records which layer it had.
tests/netfaults/ holds the pieces: the layers (`topology.py`), the proxy (`proxy.py`), the
faults and their evidence (`faults.py`), the run (`run.py`), the scenarios
(`scenarios.py`) and the model (`models/tally.stm`).

Nothing is asserted per scenario. The workers and the client write every operation to a
history (`harel_beanie.history`: invoke, then ok / fail / unknown, a timed-out write being
unknown, a killed worker's open invokes unknown too), the final state of every execution is
appended once the faults healed and the work drained, and the checker decides: every event
whose send was acknowledged applied exactly once, an unknown one at most once, none that was
never sent; each execution's versions one chain (no two commits on one version, none
skipped, no acknowledged commit missing after a restart, every version written by a
recorded commit); no read older than a commit acknowledged before it began; every final
state equal to harel's in-memory run of the events the execution applied, in their order;
outbox, spawns, timers, transport messages and leases all drained. Every fault must also
show that it acted on the workers' traffic (packets dropped, messages delayed, duplicated or
cut, a server seen stopped, connections the server closed, replies a fail point changed).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from tests.netfaults.run import Outcome, Run, Scenario
from tests.netfaults.scenarios import FORGETFUL, LOOPBACK_SHORT, SHORT, SOAK

TRANSPORTS = ("beanie", "harel")


def run(scenario: Scenario, tmp: Path, *, transport: str, layer: Any = None, seed: int = 1) -> Outcome:
    return asyncio.run(Run(scenario, tmp, transport=transport, layer=layer, seed=seed).go())


def assert_proven(outcome: Outcome, scenario: Scenario, figures: Any) -> None:
    verdict = outcome.verdict
    assert verdict is not None
    figures.set(**outcome.figures())
    where = f"(history: {outcome.history}; logs beside it)"
    assert outcome.settled, f"the work did not drain within the run's limit {where}\n{verdict.summary()}"
    assert verdict.ok, f"{verdict.summary()}\n{where}"
    assert len(outcome.faults) == len(scenario.faults), outcome.faults
    unfired = [f for f in outcome.faults if not f["fired"]]
    assert not unfired, f"faults with no evidence that they acted: {unfired}"
    assert not outcome.exits, f"workers ended by themselves (name: exit code): {outcome.exits}; see their logs"
    assert outcome.kills == scenario.kills, f"{outcome.kills} of {scenario.kills} worker kills happened"
    # the faults reached the workload: operations outlasted the drivers' socket timeout or
    # ended not knowing whether they landed, or (on harel's transport, whose claims the
    # history does not record) the workers' drivers lost operations to the network
    reached = outcome.late + verdict.figures["unknown"] + outcome.worker_network_errors
    assert reached > 0, (outcome.late, outcome.worker_network_errors, verdict.figures)


def test_one_of_each_fault_on_the_namespace_layer(tmp_path: Path, figures: Any) -> None:
    """The default run, about forty seconds of faults on this package's transport, three
    workers, two of them SIGKILLed meanwhile: a partition of one worker longer than a lease,
    replies later than the socket timeout, a half-open link, writes run twice and reordered,
    the server paused past a lease, 30% packet loss, a fail point closing connections, the
    server SIGKILLed and restarted on its data. The history checks out with 0 anomalies and
    every fault shows it acted. On network namespaces where they can be made (root, `ip`,
    `nft`), else on loopback, as the figures say."""
    outcome = run(SHORT, tmp_path, transport="beanie")
    assert_proven(outcome, SHORT, figures)


def test_the_loopback_layer_on_harels_transport(tmp_path: Path, figures: Any) -> None:
    """The fallback layer, always run: everything on loopback, the proxy holding both
    directions for a partition and the replies for a half-open link, writes run twice,
    streams cut, a worker killed; the workers on harel's own Mongo transport this time. The
    history checks out with 0 anomalies."""
    outcome = run(LOOPBACK_SHORT, tmp_path, transport="harel", layer="loopback")
    assert outcome.layer.startswith("loopback")
    assert_proven(outcome, LOOPBACK_SHORT, figures)


def test_a_worker_that_forgets_its_dedupe_fails_the_check(tmp_path: Path, figures: Any) -> None:
    """The check can fail: two workers whose store answers "not processed yet" for every
    event (`tests/netfaults/forgetful_worker.py`), a publisher sending a third of its events
    twice and the network duplicating its writes. The checker reports the events applied
    twice, by id, and nothing else."""
    outcome = run(FORGETFUL, tmp_path, transport="beanie")
    verdict = outcome.verdict
    assert verdict is not None and outcome.settled
    figures.set(doubled=len(verdict.anomalies), events_sent=verdict.figures["events_sent"])
    assert not verdict.ok
    assert {a.kind for a in verdict.anomalies} == {"doubled"}, verdict.summary()
    resent = {e for e, s in outcome.sends.items() if len(s["outcomes"]) > 1}
    doubled = {re.search(r"event '([^']+)'", a.detail).group(1) for a in verdict.anomalies}  # type: ignore[union-attr]
    assert doubled <= resent, sorted(doubled - resent)[:5]


@pytest.mark.soak
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("scenario", SOAK, ids=[s.name for s in SOAK])
def test_each_scenario_soak(scenario: Scenario, transport: str, tmp_path: Path, figures: Any) -> None:
    """Each scenario on its own for about forty-five seconds, on both transports, with three
    or four worker kills on top: partitions of lease holders, slow replies, half-open links,
    server pauses, duplicated and reordered writes, packet loss, links down, cut streams,
    server restarts (SIGTERM and SIGKILL), step-downs and the four fail points. Every
    history checks out with 0 anomalies and every fault shows it acted."""
    outcome = run(scenario, tmp_path, transport=transport, seed=sum(map(ord, scenario.name + transport)))
    assert_proven(outcome, scenario, figures)
