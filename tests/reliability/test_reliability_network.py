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
tests/support/netfaults/ holds the pieces: the layers (`topology.py`), the proxy (`proxy.py`), the
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
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from harel_beanie.deploy.embedded import free_port
from harel_beanie.history.records import HistoryWriter
from tests.support.netfaults.echo import ask, message
from tests.support.netfaults.faults import Fault, Injector
from tests.support.netfaults.proxy import FaultProxy
from tests.support.netfaults.run import Outcome, Run, Scenario
from tests.support.netfaults.scenarios import FORGETFUL, LOOPBACK_SHORT, SHORT, SOAK
from tests.support.netfaults.topology import Loopback, Namespaces, Network, namespaces_possible

TRANSPORTS = ("beanie", "harel")


def run(scenario: Scenario, tmp: Path, *, transport: str, layer: Any = None, seed: int = 1) -> Outcome:
    return asyncio.run(Run(scenario, tmp, transport=transport, layer=layer, seed=seed).go())


def assert_proven(outcome: Outcome, scenario: Scenario, figures: Any) -> None:
    verdict = outcome.verdict
    assert verdict is not None
    figures.set(**outcome.figures())
    where = f"(history: {outcome.history}; logs beside it)"
    assert outcome.settled, f"the work did not drain within the run's limit {where}\n{verdict.summary()}"
    assert verdict.ok, f"{verdict.summary()}\n{where}\n{outcome.told()}"
    # the counts the store, the dashboard and `harel-beanie status` show are the documents'
    assert not outcome.count_problems(), "\n".join(outcome.count_problems())
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
    every fault shows it acted. On network namespaces, asserted: where they cannot be made
    (not root, no `ip` or `nft`) the test is skipped with the reason, and the loopback
    layer's test below covers the fallback.

    The writes run twice are also reordered across connections (the proxy's jitter, whose
    overtaken requests are counted), and every publish and delivery is recorded: the
    checker's FIFO rule passes, on pairs of ordered publishes it really compared."""
    possible, why = namespaces_possible()
    if not possible:
        pytest.skip(f"network namespaces cannot be made here ({why}); the loopback test runs the fallback")
    outcome = run(SHORT, tmp_path, transport="beanie", layer="namespaces")
    assert outcome.layer == Namespaces.layer and not outcome.fallback_reason, (outcome.layer, outcome.fallback_reason)
    assert_proven(outcome, SHORT, figures)
    assert outcome.verdict is not None and outcome.verdict.figures["fifo_pairs"] > 0, outcome.verdict.figures
    reordering = next(f for f in outcome.faults if f["kind"] == "duplicate")
    assert sum(reordering["reordered"].values()) > 0, reordering


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
    event (`tests/support/netfaults/forgetful_worker.py`), a publisher sending a third of its events
    twice and the network duplicating its writes. The checker reports the events applied
    twice, by id, and nothing else."""
    outcome = run(FORGETFUL, tmp_path, transport="beanie")
    verdict = outcome.verdict
    assert verdict is not None and outcome.settled
    figures.set(doubled=len(verdict.anomalies), events_sent=verdict.figures["events_sent"])
    assert not verdict.ok
    assert {a.kind for a in verdict.anomalies} == {"doubled"}, verdict.summary()
    # events applied twice are still counted exactly: the counts follow the documents
    assert not outcome.count_problems(), "\n".join(outcome.count_problems())
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


# --- the evidence itself --------------------------------------------------------------------


class StubServer:
    """What the injector's server faults need of a server (`proc`, `pause`, `resume`), over
    the echo server of tests/support/netfaults/echo.py."""

    def __init__(self, port: int) -> None:
        self.proc: Optional[subprocess.Popen[bytes]] = subprocess.Popen(
            [sys.executable, "-m", "tests.support.netfaults.echo", str(port)],
            cwd=Path(__file__).resolve().parents[2],
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == b"ready"

    def pause(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        assert self.proc is not None
        self.resume()
        self.proc.kill()
        self.proc.wait()


def _injector(network: Network, server: Any, tmp: Path) -> Injector:
    # the admin client connects only when a stepdown or a fail point uses it: none here
    return Injector(network, server, "mongodb://127.0.0.1:9/", HistoryWriter(tmp / "faults.jsonl", "test"))


@pytest.fixture
def loopback(tmp_path: Path) -> Iterator[tuple[Network, StubServer, Injector]]:
    port = free_port()
    server = StubServer(port)
    proxy = FaultProxy()
    network = Loopback(proxy, port)
    for host in ("w1", "w2"):
        network.add_host(host)
    injector = _injector(network, server, tmp_path)
    try:
        yield network, server, injector
    finally:
        injector.admin.close()
        proxy.close()
        server.close()


@pytest.fixture
def namespaces(tmp_path: Path) -> Iterator[tuple[Namespaces, Injector]]:
    possible, why = namespaces_possible()
    if not possible:
        pytest.skip(f"network namespaces cannot be made here: {why}")
    proxy = FaultProxy()
    network = Namespaces(proxy)
    try:
        for host in ("w1", "w2"):
            network.add_host(host)
        injector = _injector(network, None, tmp_path)
        yield network, injector
        injector.admin.close()
    finally:
        network.close()
        proxy.close()


def _route(network: Network, host: str) -> tuple[str, int]:
    place = network.hosts[host]
    return place.url_host, place.url_port


def test_overlapping_proxy_faults_read_only_their_own_host(loopback: Any) -> None:
    """Two proxy faults at once, one on w1 and one on w2, and traffic through w2's route only:
    w1's fault reads zero, w2's the messages it delayed. The evidence used to be summed over
    every route, so a fault on a host nobody used was credited with another host's."""
    network, _, injector = loopback
    on_w1 = injector.apply(Fault("slow", 0, 1, ("w1",), (("delay", 0.05),)))
    on_w2 = injector.apply(Fault("slow", 0, 1, ("w2",), (("delay", 0.05),)))
    for k in range(3):
        ask(_route(network, "w2"), request_id=k + 1)
    assert injector.read(on_w1) == {"w1": 0}
    assert injector.read(on_w2) == {"w2": 6}  # three requests and their three replies, each delayed
    on_w1.undo()
    on_w2.undo()


def test_overlapping_nft_faults_keep_their_own_counters(namespaces: Any) -> None:
    """Partitions of w1 and w2 at once, on the namespace layer: packets sent over w2's link
    and from w2's upstream address count for w2's fault only, w1's reads zero; then w2's
    fault is lifted (its tables deleted) and w1's counters are still there, counting w1's
    own packets. Before, every host's rules shared one table per namespace, reloaded
    whole at each change (resetting every counter in it), and a host's evidence summed the
    server namespace's counters of every host."""
    network, injector = namespaces
    on_w1 = injector.apply(Fault("partition", 0, 1, ("w1",)))
    on_w2 = injector.apply(Fault("partition", 0, 1, ("w2",)))

    def send(host: str, n: int) -> None:
        ns, _link, index = network.links[host]
        subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                ns,
                sys.executable,
                "-c",
                (
                    "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                    f"for _ in range({n}):\n"
                    "    try: s.sendto(b'x', (%r, 9))\n"
                    "    except OSError: pass\n" % network.hosts[host].url_host
                ),
            ],
            check=True,
            timeout=30,
        )
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:  # from its upstream address
            udp.bind((f"10.{network.net}.0.{10 + index}", 0))
            for _ in range(n):
                udp.sendto(b"x", network.server_addr)

    send("w2", 3)
    assert on_w1.evidence() == {"w1": 0}
    assert on_w2.evidence() == {"w2": 6}  # three out of its link, three into the server's namespace
    send("w1", 2)
    assert on_w1.evidence() == {"w1": 4}
    on_w2.undo()
    assert on_w1.evidence() == {"w1": 4}, "lifting w2's fault reset w1's counters"
    on_w1.undo()


def test_a_pause_fires_on_the_workers_writes_it_held(loopback: Any) -> None:
    """A server pause is evidenced by the workers' traffic, not by the process state: with
    no worker writing during the stop it reads zero on every route (it used to read 1 as
    soon as the process showed `T`); a write sent through w1's route during the stop, left
    unanswered until the server resumed, fires it on w1 alone."""
    network, _, injector = loopback
    quiet = injector.apply(Fault("pause", 0, 1.5, ("server",)))
    time.sleep(1.5)
    assert injector.read(quiet) == {"w1": 0, "w2": 0}
    quiet.undo()

    paused = injector.apply(Fault("pause", 0, 1.5, ("server",)))
    with socket.create_connection(_route(network, "w1"), timeout=10) as sock:
        sock.sendall(message(7))
        time.sleep(1.5)
        assert injector.read(paused) == {"w1": 1, "w2": 0}
        paused.undo()
        assert sock.recv(4, socket.MSG_WAITALL)  # answered once the server resumed


def test_a_link_down_fires_on_the_hosts_own_traffic(namespaces: Any) -> None:
    """Links of w1 and w2 taken down at once, on the namespace layer: a process in w1's
    namespace trying to reach the server meanwhile makes w1's fault fire (its packets found
    no route), and w2's, with nothing of w2's trying, reads zero. A link seen down was the
    evidence before: the test's own act."""
    network, injector = namespaces
    on_w1 = injector.apply(Fault("link_down", 0, 1, ("w1",)))
    on_w2 = injector.apply(Fault("link_down", 0, 1, ("w2",)))
    ns = network.links["w1"][0]
    host, port = _route(network, "w1")
    subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            ns,
            sys.executable,
            "-c",
            (
                "import socket\n"
                "for _ in range(3):\n"
                f"    try: socket.create_connection(({host!r}, {port}), timeout=1)\n"
                "    except OSError: pass\n"
            ),
        ],
        check=True,
        timeout=30,
    )
    assert on_w1.evidence()["w1"] >= 3
    assert on_w2.evidence() == {"w2": 0}
    on_w1.undo()
    on_w2.undo()
