"""The network-fault scenarios: the short run the default suite makes, and the soak's.

Times are seconds into the client's send window. A fault on several hosts must act on
each of them (tests/support/netfaults/faults.py), so the short runs' random shares are set high
enough for a few seconds of one worker's writes to meet them. Every scenario also SIGKILLs workers at
random moments and starts them again (`kills`). The leases the workers take last
`run.VISIBILITY` (4 s): the partitions and the pause outlast them, so another worker takes
over events whose holder is cut off, and the holder's late commits must lose.
"""

from __future__ import annotations

from tests.support.netfaults.faults import Fault
from tests.support.netfaults.run import Scenario

ALL = ("w1", "w2", "w3")
EVERYONE = (*ALL, "client")  # the proxy's faults meet the publisher too
SERVER = ("server",)

# One of each kind of fault, back to back, in about forty seconds.
SHORT = Scenario(
    "short",
    faults=(
        Fault("partition", 1, 5, ("w1",)),
        Fault("slow", 7, 3, ("w2", "client"), (("delay", 2.5),)),
        Fault("half_open", 11, 3, ("w3",)),
        Fault("duplicate", 15, 4, EVERYONE, (("share", 0.5), ("jitter", 0.3))),
        Fault("pause", 20, 5.5, SERVER),
        Fault("lossy", 26.5, 3, ("w2",), (("percent", 30),)),
        Fault("failpoint", 30.5, 3, SERVER, (("mode", "close"), ("times", 8))),
        Fault("restart", 34.5, 1.5, SERVER, (("kill", True),)),
    ),
    kills=2,
    seconds=38,
)

# A worker whose store forgets which events it processed, and a publisher that sends a third
# of its events twice: the checker must fail this run (its doubled events).
FORGETFUL = Scenario(
    "forgetful",
    faults=(Fault("duplicate", 1, 8, ("client",), (("share", 0.5),)),),
    resend_share=0.3,
    kills=0,
    workers=2,
    seconds=10,
    echo_share=0.0,
    worker=("tests.support.netfaults.forgetful_worker",),
)

# The fallback layer's short run (loopback, the proxy standing in for nft).
LOOPBACK_SHORT = Scenario(
    "loopback",
    faults=(
        Fault("partition", 1, 5, ("w1",)),
        Fault("half_open", 7, 3, ("w2",)),
        Fault("duplicate", 11, 4, EVERYONE, (("share", 0.6), ("jitter", 0.3))),
        Fault("cut", 16, 4, EVERYONE, (("share", 0.1),)),
    ),
    kills=1,
    seconds=26,  # the kill falls after the faults on hosts, with time to come back
)


def _repeat(
    kind: str, hosts: tuple[str, ...], hold: float, every: float, count: int, *params: tuple[str, object]
) -> tuple[Fault, ...]:
    """`count` faults of one kind, `every` seconds apart from the second second on."""
    return tuple(Fault(kind, 2 + k * every, hold, hosts, tuple(params)) for k in range(count))


SOAK = (
    # a worker cut off both ways while it holds leases, three times, each longer than a lease
    Scenario(
        "partition",
        tuple(Fault("partition", at, 7, ("w1",)) for at in (2, 17, 32))
        + tuple(Fault("partition", at, 5, ("w2",)) for at in (10, 25)),
        kills=3,
        seconds=45,
    ),
    # every reply later than the drivers' socket timeout
    Scenario("slow", _repeat("slow", EVERYONE, 5, 14, 3, ("delay", 2.5)), kills=3, seconds=45),
    # requests arrive, replies are lost
    Scenario(
        "half-open",
        _repeat("half_open", ("w1",), 6, 14, 3) + _repeat("half_open", ("w2",), 4, 14, 3),
        kills=3,
        seconds=45,
    ),
    # the server stopped longer than a lease
    Scenario("pause", _repeat("pause", SERVER, 7, 16, 3), kills=3, seconds=50),
    # writes that run twice, and writes reordered across connections, all along
    Scenario(
        "duplicate", (Fault("duplicate", 1, 40, EVERYONE, (("share", 0.3), ("jitter", 0.4))),), kills=4, seconds=42
    ),
    # a random share of packets dropped
    Scenario("loss", _repeat("lossy", ALL, 8, 14, 3, ("percent", 30)), kills=3, seconds=45),
    # links taken down
    Scenario(
        "link-down",
        _repeat("link_down", ("w1",), 6, 14, 3) + _repeat("link_down", ("w3",), 3, 14, 3),
        kills=3,
        seconds=45,
    ),
    # streams cut mid-message
    Scenario("cut", (Fault("cut", 1, 40, EVERYONE, (("share", 0.03),)),), kills=3, seconds=42),
    # the server restarted on its data, once gently and once killed
    Scenario(
        "restart",
        (Fault("restart", 8, 2, SERVER), Fault("restart", 25, 2, SERVER, (("kill", True),))),
        kills=3,
        seconds=40,
    ),
    # failover stand-ins: no primary for a while, then the fail points a failover shows
    Scenario("stepdown", _repeat("stepdown", SERVER, 4, 12, 3), kills=3, seconds=40),
    Scenario(
        "failpoints",
        (
            Fault("failpoint", 2, 4, SERVER, (("mode", "close"), ("times", 15))),
            Fault("failpoint", 10, 6, SERVER, (("mode", "block"), ("block_ms", 3000), ("times", 6))),
            Fault("failpoint", 20, 4, SERVER, (("mode", "label"), ("times", 15))),
            Fault("failpoint", 28, 4, SERVER, (("mode", "wce"), ("times", 15))),
        ),
        kills=3,
        seconds=36,
    ),
)
