"""The faults a network-fault run injects, and the proof that each one fired on its target.

A `Fault` says what happens, when (seconds into the client's send window), for how long
and to which hosts. The `Injector` plays a scenario's faults, lifts each after its time,
writes each one to the history (`f: "fault"`, type "info", for the figures) and records
evidence that it acted on the workers' traffic. A fault with no evidence fails the run: a
fault test that cannot tell whether its fault happened proves nothing.

The evidence is read per host, for the fault's own hosts and its own window: each reader
is taken when the fault is applied and read when it is lifted, before it is undone, and
never summed across hosts, so two faults that overlap in time never credit each other.

- A fault on hosts (a link fault, a proxy fault) fired when every one of its hosts shows
  it: packets dropped by that fault's own nft counter for that host (one table per fault
  and host, so no other fault's table loads or deletes reset it), packets the host sent
  with no route while its link was down (its namespace's `OutNoRoutes`), or messages of
  that host's proxy route held, delayed, duplicated or cut.
- A fault on the server fired when the routes of the server's clients show it, per route:
  for `pause`, writes a worker sent during the stop that got no reply by its end (the
  process state only says that the signal arrived, not that a worker met it); for
  `restart`, connections the server closed; for `stepdown`, writes refused for want of a
  primary; for `failpoint`, the replies it changed. A route another fault acted on during
  the window is left out, so that its fault's effects are not taken for this one's.

Kinds:
- on a host's link: `partition` (both ways), `half_open` (replies lost), `lossy` (a
  random share of packets, `percent`), `link_down`;
- in the proxy, on a host's route: `slow` (every message `delay` seconds late, beyond the
  drivers' socket timeout), `duplicate` (writes run twice, `share`) with `jitter`
  (reordering across connections, counted as `reordered` beside the evidence), `cut`
  (streams cut mid-message, `share`);
- on the server: `pause` (SIGSTOP, then SIGCONT), `restart` (SIGTERM, or SIGKILL with
  `kill`, then started on the same data), `stepdown` (`replSetStepDown` with `force`: no
  primary for `hold` seconds), `failpoint` (a `failCommand` fail point: `mode` "close",
  "block", "label" or "wce", on `commands`, `times` times).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import pymongo

from harel_beanie.deploy.embedded import EmbeddedServer
from harel_beanie.history.records import HistoryWriter
from tests.support.netfaults.topology import Network

LINK = ("partition", "half_open", "lossy", "link_down")
PROXY = ("slow", "duplicate", "cut")
SERVER = ("pause", "restart", "stepdown", "failpoint")


@dataclass(frozen=True)
class Fault:
    kind: str
    at: float  # seconds into the send window
    hold: float  # seconds it lasts
    hosts: tuple[str, ...] = ("w1",)
    params: tuple[tuple[str, Any], ...] = ()

    def param(self, key: str, default: Any) -> Any:
        return dict(self.params).get(key, default)


#: a fault's evidence: how many of each host's messages or packets it acted on
Evidence = dict[str, int]


@dataclass
class Applied:
    fault: Fault
    tag: str  # names its nft tables and counters
    how: str
    undo: Callable[[], None]
    evidence: Callable[[], Evidence]  # read before `undo`
    on_hosts: bool = True  # each of its hosts must show evidence; else (the server's) some route must
    notes: Callable[[], dict[str, Any]] = dict  # more of what it did, for the log
    began: float = field(default_factory=time.monotonic)
    ended: Optional[float] = None

    def overlaps(self, other: "Applied") -> bool:
        return other.began <= (self.ended or time.monotonic()) and self.began <= (other.ended or time.monotonic())


def fired(evidence: Evidence, on_hosts: bool) -> bool:
    """A fault on hosts fired on each of them; a fault on the server, on some route."""
    return bool(evidence) and (all if on_hosts else any)(n > 0 for n in evidence.values())


def stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (state `T`)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


class Injector:
    def __init__(self, network: Network, server: EmbeddedServer, url: str, writer: HistoryWriter) -> None:
        self.network, self.server, self.url, self.writer = network, server, url, writer
        self.active: list[Applied] = []
        self.applied: list[Applied] = []  # every fault applied, for the overlaps
        self.log: list[dict[str, Any]] = []
        self.admin: Any = pymongo.MongoClient(url, serverSelectionTimeoutMS=20_000)

    async def play(self, faults: tuple[Fault, ...]) -> None:
        """Apply each fault at its time, lift it after its hold; return when all are lifted."""
        begun = time.monotonic()
        await asyncio.gather(*(self._one(f, begun) for f in faults))

    async def _one(self, fault: Fault, begun: float) -> None:
        await asyncio.sleep(max(0.0, begun + fault.at - time.monotonic()))
        applied = await asyncio.to_thread(self.apply, fault)
        self.writer.info("fault", kind=fault.kind, target=",".join(fault.hosts), how=applied.how, phase="on")
        await asyncio.sleep(fault.hold)
        await self._lift(applied)

    async def _lift(self, applied: Applied) -> None:
        if applied not in self.active:
            return
        self.active.remove(applied)
        evidence = await asyncio.to_thread(self.read, applied)
        await asyncio.to_thread(applied.undo)
        f = applied.fault
        happened = fired(evidence, applied.on_hosts)
        self.writer.info("fault", kind=f.kind, target=",".join(f.hosts), phase="off", fired=happened, evidence=evidence)
        self.log.append(
            {
                "kind": f.kind,
                "hosts": list(f.hosts),
                "how": applied.how,
                "fired": happened,
                "evidence": evidence,
                **applied.notes(),
                "seconds": round(time.monotonic() - applied.began, 1),
            }
        )

    def read(self, applied: Applied) -> Evidence:
        """The fault's evidence at the end of its window; for a fault on the server, without
        the routes another fault on hosts acted on meanwhile."""
        applied.ended = time.monotonic()
        evidence = applied.evidence()
        if applied.on_hosts:
            return evidence
        busy = {
            h
            for other in self.applied
            if other is not applied and other.on_hosts and other.overlaps(applied)
            for h in other.fault.hosts
        }
        return {h: n for h, n in evidence.items() if h not in busy}

    async def heal_all(self) -> None:
        """Lift whatever is still on (a run that ended early), and close the admin client."""
        for applied in list(self.active):
            await self._lift(applied)
        self.admin.close()

    # --- each kind -----------------------------------------------------------------------

    def apply(self, f: Fault) -> Applied:
        """Apply `f`, its evidence readers taken first (what it does from then on is its)."""
        tag = f"f{len(self.applied) + 1}"
        if f.kind in LINK:
            applied = self._link(f, tag)
        elif f.kind in PROXY:
            applied = self._proxy(f, tag)
        elif f.kind == "pause":
            applied = self._pause(f, tag)
        elif f.kind == "restart":
            applied = self._restart(f, tag)
        elif f.kind == "stepdown":
            applied = self._stepdown(f, tag)
        elif f.kind == "failpoint":
            applied = self._failpoint(f, tag)
        else:
            raise ValueError(f"no fault kind {f.kind!r}")
        self.applied.append(applied)
        self.active.append(applied)
        return applied

    def _routes(self, counter: str, hosts: Optional[tuple[str, ...]] = None) -> Callable[[], Evidence]:
        """Evidence from the proxy: how much `counter` grew on each route of `hosts` (every
        route: the workers' and the client's, when None), route by route."""
        proxy = self.network.proxy
        readers = {h: proxy.growth(h, counter) for h in (hosts or tuple(proxy.routes))}
        return lambda: {h: read() for h, read in readers.items()}

    def _link(self, f: Fault, tag: str) -> Applied:
        net = self.network
        hows, readers, cut = [], {}, []
        for h in f.hosts:
            if f.kind == "partition":
                how, reader = net.partition(h, tag)
            elif f.kind == "half_open":
                how, reader = net.half_open(h, tag)
            elif f.kind == "lossy":
                made = net.lossy(h, int(f.param("percent", 25)), tag)
                if made is None:  # loopback: the nearest stand-in is the proxy cutting streams
                    reader = net.proxy.growth(h, "cut")
                    net.proxy.set(h, cut=0.05)
                    cut.append(h)
                    how = "loopback has no packet loss: the proxy cuts 5% of messages instead"
                else:
                    how, reader = made
            else:
                how, reader = net.link_down(h, tag)
            hows.append(how)
            readers[h] = reader

        def undo() -> None:
            for h in f.hosts:
                net.heal(h, tag)
            for h in cut:
                net.proxy.unset(h, "cut")

        return Applied(f, tag, "; ".join(hows), undo, lambda: {h: read() for h, read in readers.items()})

    def _proxy(self, f: Fault, tag: str) -> Applied:
        proxy = self.network.proxy
        changes = {
            "slow": {"delay": f.param("delay", 2.5)},
            "duplicate": {"duplicate": f.param("share", 0.3), "jitter": f.param("jitter", 0.3)},
            "cut": {"cut": f.param("share", 0.05)},
        }[f.kind]
        counter = {"slow": "delayed", "duplicate": "duplicated", "cut": "cut"}[f.kind]
        evidence = self._routes(counter, f.hosts)
        reordered = self._routes("reordered", f.hosts)
        for h in f.hosts:
            proxy.set(h, **changes)

        def undo() -> None:
            for h in f.hosts:
                proxy.unset(h, *changes)

        notes: Callable[[], dict[str, Any]] = (lambda: {"reordered": reordered()}) if "jitter" in changes else dict
        return Applied(f, tag, f"proxy {changes} on {', '.join(f.hosts)}", undo, evidence, notes=notes)

    def _pause(self, f: Fault, tag: str) -> Applied:
        server, proxy = self.server, self.network.proxy
        assert server.proc is not None
        began = time.monotonic()
        server.pause()
        pid = server.proc.pid
        for _ in range(100):  # the stop is delivered asynchronously
            if stopped(pid):
                break
            time.sleep(0.01)
        workers = tuple(self.network.hosts)

        def evidence() -> Evidence:
            until = time.monotonic()
            return {h: proxy.stalled(h, began, until) for h in workers}

        how = f"server SIGSTOPped for {f.hold:g}s ({'seen stopped' if stopped(pid) else 'stop not seen'})"
        return Applied(f, tag, how, server.resume, evidence, on_hosts=False, began=began)

    def _restart(self, f: Fault, tag: str) -> Applied:
        kill = bool(f.param("kill", False))
        closed = self._routes("server_closed")
        self.server.stop(kill=kill)
        how = f"server stopped ({'SIGKILL' if kill else 'SIGTERM'}) for {f.hold:g}s, started again on its data"
        return Applied(f, tag, how, lambda: self.server.start() and None, closed, on_hosts=False)

    def _stepdown(self, f: Fault, tag: str) -> Applied:
        seconds = max(1, int(f.hold))
        refused = self._routes("not_primary")
        self.admin.admin.command("replSetStepDown", seconds, force=True)
        how = f"replSetStepDown force: {seconds}s without a primary"
        return Applied(f, tag, how, lambda: None, refused, on_hosts=False)

    def _failpoint(self, f: Fault, tag: str) -> Applied:
        mode = f.param("mode", "close")
        data: dict[str, Any] = {"failCommands": list(f.param("commands", ("update", "findAndModify", "insert")))}
        if mode == "close":
            data["closeConnection"] = True
            counter = "server_closed"
        elif mode == "block":
            data.update(blockConnection=True, blockTimeMS=int(f.param("block_ms", 3000)))
            counter = "slow_replies"
        elif mode == "label":
            data.update(errorCode=91, errorLabels=["RetryableWriteError"])  # ShutdownInProgress
            counter = "error_labels"
        elif mode == "wce":
            data["writeConcernError"] = {"code": 64, "codeName": "WriteConcernFailed", "errmsg": "injected"}
            counter = "write_concern_errors"
        else:
            raise ValueError(f"no fail point mode {mode!r}")
        times = int(f.param("times", 20))
        hits = self._routes(counter)
        self.admin.admin.command("configureFailPoint", "failCommand", mode={"times": times}, data=data)

        def off() -> None:
            self.admin.admin.command("configureFailPoint", "failCommand", mode="off")

        how = f"failCommand {mode} on {data['failCommands']}, {times} times"
        return Applied(f, tag, how, off, hits, on_hosts=False)
