"""Where the network-fault runs put the server, the workers and the fault proxy, and how
faults reach the links between them.

Two layers, one interface (`Network`), and each run says which one it had:

- `Namespaces` (needs root, `ip` and `nft`): the server runs in a network namespace of its
  own and each worker in another, every namespace joined to this one by a veth pair. The
  test's fault proxy (tests/support/netfaults/proxy.py) listens on this namespace's end of each
  worker's link and connects to the server from an address of that worker's own, so nft
  rules in the worker's namespace and in the server's can cut exactly one worker off, both
  ways (a partition), one way (half-open), or drop a random share of its packets
  (`numgen random`); a link can be taken down. No routing is switched on anywhere: every
  address a process uses is one end of a veth pair it sits on.
- `Loopback` (the fallback where namespaces cannot be made): everything on 127.0.0.1, the
  proxy's holds standing in for partitions and half-open links; packet loss and links
  taken down are not available there (the proxy's `cut` and `drop_connections` are the
  nearest, and are reported as such).

Everything made is removed on `close()` (also after a failure: use it as a context
manager). Namespaces and links carry the run's tag, and `sweep_stale()` removes those left
by a run that was killed before it could clean up.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from tests.support.netfaults.proxy import FaultProxy

PREFIX = "hbnf"  # every namespace and link this module makes starts with it
SERVER_PORT = 27017
#: a fault's evidence on one host: how many of its messages or packets the fault acted on
Reader = Callable[[], int]


def _run(*argv: str, check: bool = True, input: Optional[str] = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=check, capture_output=True, text=True, input=input, timeout=30)


def namespaces_possible() -> tuple[bool, str]:
    """Whether this machine lets the test make namespaces and nft rules, and why not."""
    if os.geteuid() != 0:
        return False, "not root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` is not installed (make test installs iproute2 and nftables)"
    probe = f"{PREFIX}probe{os.getpid() % 10000}"
    try:
        made = _run("ip", "netns", "add", probe, check=False)
        if made.returncode:
            return False, f"ip netns add failed: {made.stderr.strip()}"
        nft = _run("ip", "netns", "exec", probe, "nft", "add", "table", "inet", "probe", check=False)
        if nft.returncode:
            return False, f"nft failed in a namespace: {nft.stderr.strip()}"
        return True, ""
    finally:
        _run("ip", "netns", "del", probe, check=False)


def sweep_stale() -> list[str]:
    """Delete namespaces a killed run left (their pid is in the name and is gone)."""
    gone = []
    listed = _run("ip", "netns", "list", check=False).stdout.split()
    for name in listed:
        if not name.startswith(PREFIX) or "-" not in name:
            continue
        pid = name[len(PREFIX) :].split("-")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _kill_inside(name)
            _run("ip", "netns", "del", name, check=False)
            gone.append(name)
    return gone


def _kill_inside(ns: str) -> None:
    pids = _run("ip", "netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
            pass


@dataclass
class Host:
    """A place a process runs: its command prefix and how it reaches the server."""

    name: str
    prefix: list[str]  # put before a command to run it there
    url_host: str  # where its MongoDB URL points (the proxy's listener for it)
    url_port: int


class Network:
    """The interface both layers offer. `layer` names the one that ran."""

    layer = ""
    server_bind = "127.0.0.1"
    server_prefix: list[str] = []

    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy
        self.hosts: dict[str, Host] = {}

    # the server's address as this namespace reaches it
    server_addr = ("127.0.0.1", SERVER_PORT)

    def add_host(self, name: str) -> Host:
        raise NotImplementedError

    # Each fault on a host is applied under the fault's own `tag`, and returns what was done
    # (for the history) and its evidence: a reader of how many of that host's messages or
    # packets it has acted on since it was applied, counted for that host and that fault only.

    def partition(self, name: str, tag: str) -> tuple[str, Reader]:
        """Cut `name` off from the server both ways."""
        raise NotImplementedError

    def half_open(self, name: str, tag: str) -> tuple[str, Reader]:
        """Requests from `name` still arrive, replies to it are lost."""
        raise NotImplementedError

    def lossy(self, name: str, percent: int, tag: str) -> Optional[tuple[str, Reader]]:
        """Drop `percent` of `name`'s packets at random; None where this layer cannot."""
        raise NotImplementedError

    def link_down(self, name: str, tag: str) -> tuple[str, Reader]:
        raise NotImplementedError

    def heal(self, name: str, tag: str) -> None:
        """Undo what the fault `tag` did to `name`, and nothing another fault did."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> "Network":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Loopback(Network):
    layer = "loopback + fault proxy"

    def __init__(self, proxy: FaultProxy, server_port: int) -> None:
        super().__init__(proxy)
        self.server_addr = ("127.0.0.1", server_port)
        self.held: dict[tuple[str, str], list[str]] = {}  # (host, fault tag) -> the proxy faults it set

    def add_host(self, name: str) -> Host:
        host, port = self.proxy.add_route(name, "127.0.0.1", self.server_addr)
        self.hosts[name] = Host(name, [], host, port)
        return self.hosts[name]

    def _hold(self, name: str, tag: str, **changes: bool) -> Reader:
        self.held[(name, tag)] = list(changes)
        reader = self.proxy.growth(name, "held")
        self.proxy.set(name, **changes)
        return reader

    def partition(self, name: str, tag: str) -> tuple[str, Reader]:
        return "proxy holds both directions", self._hold(name, tag, hold=True)

    def half_open(self, name: str, tag: str) -> tuple[str, Reader]:
        return "proxy holds the replies", self._hold(name, tag, hold_replies=True)

    def lossy(self, name: str, percent: int, tag: str) -> Optional[tuple[str, Reader]]:
        return None

    def link_down(self, name: str, tag: str) -> tuple[str, Reader]:
        reader = self._hold(name, tag, hold=True)
        self.proxy.drop_connections(name)
        return "proxy dropped the connections and holds new ones", reader

    def heal(self, name: str, tag: str) -> None:
        self.proxy.unset(name, *self.held.pop((name, tag), ()))

    def close(self) -> None:
        pass


class Namespaces(Network):
    """One namespace for the server, one per host; see the module docstring."""

    layer = "network namespaces + nft + fault proxy"

    def __init__(self, proxy: FaultProxy) -> None:
        super().__init__(proxy)
        self.tag = f"{PREFIX}{os.getpid()}-{random.randrange(16**3):03x}"
        self.net = random.randrange(100, 200)  # 10.<net>.0.0/16 for this run's links
        while _run("ip", "-o", "addr", "show", check=False).stdout.count(f" 10.{self.net}.") > 0:
            self.net = random.randrange(100, 200)
        self.namespaces: list[str] = []
        self.links: dict[str, tuple[str, str, int]] = {}  # host -> (its namespace, its link, index)
        self.tables: dict[tuple[str, str], list[str]] = {}  # (host, fault tag) -> namespaces with its table
        self.downed: dict[tuple[str, str], str] = {}  # (host, fault tag) -> the link it set down
        self.server_ns = self._namespace("s")
        self.server_link = self._veth("s", self.server_ns, f"10.{self.net}.0.1/24", f"10.{self.net}.0.2/24")
        self.server_addr = (f"10.{self.net}.0.2", SERVER_PORT)
        self.server_bind = "0.0.0.0"  # inside its namespace: only its own links reach it
        self.server_prefix = ["ip", "netns", "exec", self.server_ns]

    def _namespace(self, suffix: str) -> str:
        name = f"{self.tag}-{suffix}"
        _run("ip", "netns", "add", name)
        self.namespaces.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")
        # IPv4 only: no IPv6 neighbour discovery on the links, whose packets a fault's
        # counters would take for the processes' traffic
        _run(
            "ip",
            "netns",
            "exec",
            name,
            "sysctl",
            "-qw",
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
        )
        return name

    def _veth(self, suffix: str, ns: str, here: str, there: str) -> str:
        """A veth pair: this namespace's end `here`, `ns`'s end `there`. Its name inside `ns`."""
        outer, inner = f"hb{self.tag[-3:]}{suffix}o", f"hb{self.tag[-3:]}{suffix}i"
        _run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        _run("ip", "link", "set", inner, "netns", ns)
        _run("ip", "addr", "add", here, "dev", outer)
        _run("ip", "link", "set", outer, "up")
        _run("ip", "-n", ns, "addr", "add", there, "dev", inner)
        _run("ip", "-n", ns, "link", "set", inner, "up")
        return inner

    def _nft(self, ns: str, rules: str) -> None:
        _run("ip", "netns", "exec", ns, "nft", "-f", "-", input=rules + "\n")

    def add_host(self, name: str) -> Host:
        index = len(self.links) + 1
        ns = self._namespace(f"h{index}")
        link = self._veth(f"h{index}", ns, f"10.{self.net}.{index}.1/24", f"10.{self.net}.{index}.2/24")
        # the address this host's upstream connections leave from, so the server's namespace
        # can tell this host's traffic from the others'
        source = f"10.{self.net}.0.{10 + index}"
        _run("ip", "addr", "add", f"{source}/24", "dev", f"hb{self.tag[-3:]}so")
        host, port = self.proxy.add_route(name, f"10.{self.net}.{index}.1", self.server_addr, source=source)
        self.links[name] = (ns, link, index)
        self.hosts[name] = Host(name, ["ip", "netns", "exec", ns], host, port)
        return self.hosts[name]

    def _table(self, ns: str, name: str, tag: str, rule_in: str, rule_out: str) -> Reader:
        """Load the rules of fault `tag` on host `name` in `ns` as a table of their own, their
        matches counted by a counter named after both; the reader of that counter.

        A table per fault and host: loading or deleting one never resets or removes another
        fault's rules or counters, and a counter counts one host's packets for one fault."""
        table, counter = _names(name, tag)
        self.tables.setdefault((name, tag), []).append(ns)
        hit = f'counter name "{counter}" drop;'
        self._nft(
            ns,
            f"table inet {table} {{\n"
            f"  counter {counter} {{}}\n"
            f"  chain fin {{ type filter hook input priority 0; policy accept; {rule_in + ' ' + hit if rule_in else ''} }}\n"
            f"  chain fout {{ type filter hook output priority 0; policy accept; {rule_out + ' ' + hit if rule_out else ''} }}\n"
            "}",
        )
        return lambda: _counted(ns, table, counter)

    def _source(self, name: str) -> str:
        return f"10.{self.net}.0.{10 + self.links[name][2]}"

    def partition(self, name: str, tag: str) -> tuple[str, Reader]:
        ns, link, _ = self.links[name]
        src = self._source(name)
        here = self._table(ns, name, tag, f'iifname "{link}"', f'oifname "{link}"')
        there = self._table(self.server_ns, name, tag, f"ip saddr {src}", f"ip daddr {src}")
        how = f"nft drops {name}'s link both ways in its namespace, and its upstream address in the server's"
        return how, lambda: here() + there()  # both count this host's packets only

    def half_open(self, name: str, tag: str) -> tuple[str, Reader]:
        ns, link, _ = self.links[name]
        reader = self._table(ns, name, tag, f'iifname "{link}"', "")
        return f"nft drops what arrives on {name}'s link (its requests leave, no reply gets back)", reader

    def lossy(self, name: str, percent: int, tag: str) -> Optional[tuple[str, Reader]]:
        ns, link, _ = self.links[name]
        random_share = f"numgen random mod 100 < {percent}"
        reader = self._table(ns, name, tag, f'iifname "{link}" {random_share}', f'oifname "{link}" {random_share}')
        return f"nft drops {percent}% of {name}'s packets each way (numgen random)", reader

    def link_down(self, name: str, tag: str) -> tuple[str, Reader]:
        """The evidence is the host's own traffic: packets its processes tried to send and the
        kernel found no route for (`OutNoRoutes` of its namespace, where nothing else runs),
        counted from the moment the link went down. Setting a link down is the test's act;
        that the worker then tried to use it is the fault reaching the worker."""
        ns, link, _ = self.links[name]
        before = _no_routes(ns)
        _run("ip", "-n", ns, "link", "set", link, "down")
        self.downed[(name, tag)] = link
        return f"{name}'s link set down", lambda: _no_routes(ns) - before

    def heal(self, name: str, tag: str) -> None:
        table, _ = _names(name, tag)
        for ns in self.tables.pop((name, tag), []):
            _run("ip", "netns", "exec", ns, "nft", "delete", "table", "inet", table, check=False)
        link = self.downed.pop((name, tag), None)
        if link is not None:
            _run("ip", "-n", self.links[name][0], "link", "set", link, "up", check=False)

    def close(self) -> None:
        """Kill what still runs inside, delete the namespaces (their links go with them)."""
        for ns in self.namespaces:
            _kill_inside(ns)
            _run("ip", "netns", "del", ns, check=False)
        self.namespaces.clear()


def _names(host: str, tag: str) -> tuple[str, str]:
    """The nft table and counter of fault `tag` on `host`."""
    return f"hbf_{tag}_{host}", f"{tag}_{host}"


def _counted(ns: str, table: str, counter: str) -> int:
    """Packets counter `counter` of `table` in `ns` has counted (0 once the table is gone)."""
    listed = _run("ip", "netns", "exec", ns, "nft", "-j", "list", "counter", "inet", table, counter, check=False)
    for item in json.loads(listed.stdout or "{}").get("nftables", []):
        if "counter" in item:
            return int(item["counter"].get("packets", 0))
    return 0


def _no_routes(ns: str) -> int:
    """`Ip: OutNoRoutes` of namespace `ns`: packets its processes sent that had no route."""
    lines = [line.split() for line in _run("ip", "netns", "exec", ns, "cat", "/proc/net/snmp").stdout.splitlines()]
    names, values = [row for row in lines if row and row[0] == "Ip:"][:2]
    return int(values[names.index("OutNoRoutes")])


def make_network(proxy: FaultProxy, server_port: int, *, layer: Optional[str] = None) -> tuple[Network, str]:
    """The namespace layer where it can be made (or `layer="loopback"` is asked for), else
    the loopback one; and why the fallback was taken, if it was."""
    if layer != "loopback":
        possible, why = namespaces_possible()
        if possible:
            sweep_stale()
            return Namespaces(proxy), ""
        if layer == "namespaces":
            raise RuntimeError(f"network namespaces were asked for and cannot be made: {why}")
        return Loopback(proxy, server_port), why
    return Loopback(proxy, server_port), "asked for"


def argv_in(host: Host, argv: Sequence[str]) -> list[str]:
    return [*host.prefix, *argv]
