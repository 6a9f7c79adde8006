"""The faults a network-fault run injects, and the proof that each one fired.

A `Fault` says what happens, when (seconds into the client's send window), for how long
and to which hosts. The `Injector` plays a scenario's faults, lifts each after its time,
writes each one to the history (`f: "fault"`, type "info", for the figures) and records
evidence that it acted on the workers' traffic: packets nft dropped (its rules' counters),
messages the proxy delayed, held, duplicated or cut, a server seen stopped (`T` in
/proc/PID/stat), and what the server's replies on the workers' routes show: connections it
closed, replies a fail point blocked, error labels and write-concern errors it injected,
writes refused for want of a primary. A fault with no evidence fails the run: a fault test
that cannot tell whether its fault happened proves nothing.

Kinds:
- on a host's link: `partition` (both ways), `half_open` (replies lost), `lossy` (a
  random share of packets, `percent`), `link_down`;
- in the proxy, on a host's route: `slow` (every message `delay` seconds late, beyond the
  drivers' socket timeout), `duplicate` (writes run twice, `share`) with `jitter`
  (reordering across connections), `cut` (streams cut mid-message, `share`);
- on the server: `pause` (SIGSTOP, then SIGCONT), `restart` (SIGTERM, or SIGKILL with
  `kill`, then started on the same data), `stepdown` (`replSetStepDown` with `force`: no
  primary for `hold` seconds), `failpoint` (a `failCommand` fail point: `mode` "close",
  "block", "label" or "wce", on `commands`, `times` times).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pymongo

from harel_beanie.history.records import HistoryWriter
from harel_beanie.ops.embedded import EmbeddedServer
from tests.netfaults.topology import Namespaces, Network

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


@dataclass
class Applied:
    fault: Fault
    how: str
    undo: Callable[[], None]
    evidence: Callable[[], int]  # how many times it acted; read before `undo`
    began: float = field(default_factory=time.monotonic)


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
        self.log: list[dict[str, Any]] = []
        self.admin: Any = pymongo.MongoClient(url, serverSelectionTimeoutMS=20_000)

    async def play(self, faults: tuple[Fault, ...]) -> None:
        """Apply each fault at its time, lift it after its hold; return when all are lifted."""
        begun = time.monotonic()
        await asyncio.gather(*(self._one(f, begun) for f in faults))

    async def _one(self, fault: Fault, begun: float) -> None:
        await asyncio.sleep(max(0.0, begun + fault.at - time.monotonic()))
        applied = await asyncio.to_thread(self.apply, fault)
        self.active.append(applied)
        self.writer.info("fault", kind=fault.kind, target=",".join(fault.hosts), how=applied.how, phase="on")
        await asyncio.sleep(fault.hold)
        await self._lift(applied)

    async def _lift(self, applied: Applied) -> None:
        if applied not in self.active:
            return
        self.active.remove(applied)
        fired = await asyncio.to_thread(applied.evidence)
        await asyncio.to_thread(applied.undo)
        f = applied.fault
        self.writer.info("fault", kind=f.kind, target=",".join(f.hosts), phase="off", fired=fired)
        self.log.append({"kind": f.kind, "hosts": list(f.hosts), "how": applied.how, "fired": fired,
                         "seconds": round(time.monotonic() - applied.began, 1)})  # fmt: skip

    async def heal_all(self) -> None:
        """Lift whatever is still on (a run that ended early), and close the admin client."""
        for applied in list(self.active):
            await self._lift(applied)
        self.admin.close()

    # --- each kind -----------------------------------------------------------------------

    def apply(self, f: Fault) -> Applied:
        if f.kind in LINK:
            return self._link(f)
        if f.kind in PROXY:
            return self._proxy(f)
        if f.kind == "pause":
            return self._pause(f)
        if f.kind == "restart":
            return self._restart(f)
        if f.kind == "stepdown":
            return self._stepdown(f)
        if f.kind == "failpoint":
            return self._failpoint(f)
        raise ValueError(f"no fault kind {f.kind!r}")

    def _routes(self, f: Fault, counter: str) -> Callable[[], int]:
        """Evidence from the proxy: how much `counter` grew on the routes (the workers' and
        the client's)."""
        proxy = self.network.proxy
        before = {h: proxy.counters(h)[counter] for h in proxy.routes}
        return lambda: sum(proxy.counters(h)[counter] - before[h] for h in before)

    def _link(self, f: Fault) -> Applied:
        net = self.network
        hows = []
        for h in f.hosts:
            if f.kind == "partition":
                hows.append(net.partition(h))
            elif f.kind == "half_open":
                hows.append(net.half_open(h))
            elif f.kind == "lossy":
                how = net.lossy(h, int(f.param("percent", 25)))
                if how is None:  # loopback: the nearest stand-in is the proxy cutting streams
                    net.proxy.set(h, cut=0.05)
                    how = "loopback has no packet loss: the proxy cuts 5% of messages instead"
                hows.append(how)
            else:
                hows.append(net.link_down(h))

        def undo() -> None:
            for h in f.hosts:
                net.heal(h)

        if isinstance(net, Namespaces):
            if f.kind == "link_down":
                evidence: Callable[[], int] = lambda: sum(net.link_is_down(h) for h in f.hosts)
            else:
                evidence = lambda: sum(net.dropped(h) for h in f.hosts)
        else:
            held, cut = self._routes(f, "held"), self._routes(f, "cut")
            evidence = lambda: held() + cut()
        return Applied(f, "; ".join(hows), undo, evidence)

    def _proxy(self, f: Fault) -> Applied:
        proxy = self.network.proxy
        changes = {
            "slow": {"delay": f.param("delay", 2.5)},
            "duplicate": {"duplicate": f.param("share", 0.3), "jitter": f.param("jitter", 0.3)},
            "cut": {"cut": f.param("share", 0.05)},
        }[f.kind]
        for h in f.hosts:
            proxy.set(h, **changes)
        counter = {"slow": "delayed", "duplicate": "duplicated", "cut": "cut"}[f.kind]

        def undo() -> None:
            for h in f.hosts:
                proxy.clear(h)

        return Applied(f, f"proxy {changes} on {', '.join(f.hosts)}", undo, self._routes(f, counter))

    def _pause(self, f: Fault) -> Applied:
        server = self.server
        assert server.proc is not None
        server.pause()
        pid, seen = server.proc.pid, 0
        for _ in range(100):  # the stop is delivered asynchronously
            if stopped(pid):
                seen = 1
                break
            time.sleep(0.01)
        return Applied(f, f"server SIGSTOPped for {f.hold:g}s", server.resume, lambda: seen)

    def _restart(self, f: Fault) -> Applied:
        kill = bool(f.param("kill", False))
        closed = self._routes(f, "server_closed")
        self.server.stop(kill=kill)
        how = f"server stopped ({'SIGKILL' if kill else 'SIGTERM'}) for {f.hold:g}s, started again on its data"
        return Applied(f, how, lambda: self.server.start() and None, closed)

    def _stepdown(self, f: Fault) -> Applied:
        seconds = max(1, int(f.hold))
        refused = self._routes(f, "not_primary")
        self.admin.admin.command("replSetStepDown", seconds, force=True)
        return Applied(f, f"replSetStepDown force: {seconds}s without a primary", lambda: None, refused)

    def _failpoint(self, f: Fault) -> Applied:
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
        hits = self._routes(f, counter)
        self.admin.admin.command("configureFailPoint", "failCommand", mode={"times": times}, data=data)

        def off() -> None:
            self.admin.admin.command("configureFailPoint", "failCommand", mode="off")

        return Applied(f, f"failCommand {mode} on {data['failCommands']}, {times} times", off, hits)
