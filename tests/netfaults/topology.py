"""Where the network-fault runs put the server, the workers and the fault proxy, and how
faults reach the links between them.

Two layers, one interface (`Network`), and each run says which one it had:

- `Namespaces` (needs root, `ip` and `nft`): the server runs in a network namespace of its
  own and each worker in another, every namespace joined to this one by a veth pair. The
  test's fault proxy (tests/netfaults/proxy.py) listens on this namespace's end of each
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
from typing import Optional, Sequence

from tests.netfaults.proxy import FaultProxy

PREFIX = "hbnf"  # every namespace and link this module makes starts with it
SERVER_PORT = 27017


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

    def partition(self, name: str) -> str:
        """Cut `name` off from the server both ways; what was done, for the history."""
        raise NotImplementedError

    def half_open(self, name: str) -> str:
        """Requests from `name` still arrive, replies to it are lost."""
        raise NotImplementedError

    def lossy(self, name: str, percent: int) -> Optional[str]:
        """Drop `percent` of `name`'s packets at random; None where this layer cannot."""
        raise NotImplementedError

    def link_down(self, name: str) -> str:
        raise NotImplementedError

    def heal(self, name: str) -> None:
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

    def add_host(self, name: str) -> Host:
        host, port = self.proxy.add_route(name, "127.0.0.1", self.server_addr)
        self.hosts[name] = Host(name, [], host, port)
        return self.hosts[name]

    def partition(self, name: str) -> str:
        self.proxy.set(name, hold=True)
        return "proxy holds both directions"

    def half_open(self, name: str) -> str:
        self.proxy.set(name, hold_replies=True)
        return "proxy holds the replies"

    def lossy(self, name: str, percent: int) -> Optional[str]:
        return None

    def link_down(self, name: str) -> str:
        self.proxy.drop_connections(name)
        self.proxy.set(name, hold=True)
        return "proxy dropped the connections and holds new ones"

    def heal(self, name: str) -> None:
        self.proxy.clear(name)

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
        self.rules: dict[str, dict[str, tuple[str, str]]] = {}  # namespace -> host -> (input, output)
        self.server_ns = self._namespace("s")
        self.server_link = self._veth("s", self.server_ns, f"10.{self.net}.0.1/24", f"10.{self.net}.0.2/24")
        self.server_addr = (f"10.{self.net}.0.2", SERVER_PORT)
        self.server_bind = "0.0.0.0"  # inside its namespace: only its own links reach it
        self.server_prefix = ["ip", "netns", "exec", self.server_ns]
        self._nft(self.server_ns, "add table inet hbfault")

    def _namespace(self, suffix: str) -> str:
        name = f"{self.tag}-{suffix}"
        _run("ip", "netns", "add", name)
        self.namespaces.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")
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
        self._nft(ns, "add table inet hbfault")
        self.hosts[name] = Host(name, ["ip", "netns", "exec", ns], host, port)
        return self.hosts[name]

    def _rule(self, ns: str, name: str, rule_in: str, rule_out: str) -> None:
        """Set `name`'s rules in `ns` (beside other hosts' rules there) and load them."""
        self.rules.setdefault(ns, {})[name] = (rule_in, rule_out)
        self._load(ns)

    def _load(self, ns: str) -> None:
        rules = self.rules.get(ns, {}).values()
        body_in = " ".join(r for r, _ in rules if r)
        body_out = " ".join(r for _, r in rules if r)
        self._nft(
            ns,
            "flush table inet hbfault\n"
            "table inet hbfault {\n"
            f"  chain fin {{ type filter hook input priority 0; policy accept; {body_in} }}\n"
            f"  chain fout {{ type filter hook output priority 0; policy accept; {body_out} }}\n"
            "}",
        )

    def _source(self, name: str) -> str:
        return f"10.{self.net}.0.{10 + self.links[name][2]}"

    def partition(self, name: str) -> str:
        ns, link, _ = self.links[name]
        self._rule(ns, name, f'iifname "{link}" counter drop;', f'oifname "{link}" counter drop;')
        src = self._source(name)
        self._rule(self.server_ns, name, f"ip saddr {src} counter drop;", f"ip daddr {src} counter drop;")
        return f"nft drops {name}'s link both ways in its namespace, and its upstream address in the server's"

    def half_open(self, name: str) -> str:
        ns, link, _ = self.links[name]
        self._rule(ns, name, f'iifname "{link}" counter drop;', "")
        return f"nft drops what arrives on {name}'s link (its requests leave, no reply gets back)"

    def lossy(self, name: str, percent: int) -> Optional[str]:
        ns, link, _ = self.links[name]
        rule = f'iifname "{link}" numgen random mod 100 < {percent} counter drop;'
        self._rule(ns, name, rule, rule.replace("iifname", "oifname"))
        return f"nft drops {percent}% of {name}'s packets each way (numgen random)"

    def link_down(self, name: str) -> str:
        ns, link, _ = self.links[name]
        _run("ip", "-n", ns, "link", "set", link, "down")
        return f"{name}'s link set down"

    def dropped(self, name: str) -> int:
        """Packets the rules for `name` dropped so far, in its namespace and the server's."""
        total = 0
        for ns in (self.links[name][0], self.server_ns):
            listed = _run("ip", "netns", "exec", ns, "nft", "-j", "list", "table", "inet", "hbfault", check=False)
            for item in json.loads(listed.stdout or "{}").get("nftables", []):
                for expr in item.get("rule", {}).get("expr", []):
                    if isinstance(expr, dict) and "counter" in expr:
                        total += int(expr["counter"].get("packets", 0))
        return total

    def link_is_down(self, name: str) -> bool:
        ns, link, _ = self.links[name]
        return "state DOWN" in _run("ip", "-n", ns, "link", "show", link, check=False).stdout

    def heal(self, name: str) -> None:
        ns, link, _ = self.links[name]
        for where in (ns, self.server_ns):
            if self.rules.get(where, {}).pop(name, None) is not None:
                self._load(where)
        _run("ip", "-n", ns, "link", "set", link, "up", check=False)
        self.proxy.clear(name)

    def close(self) -> None:
        """Kill what still runs inside, delete the namespaces (their links go with them)."""
        for ns in self.namespaces:
            _kill_inside(ns)
            _run("ip", "netns", "del", ns, check=False)
        self.namespaces.clear()


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
