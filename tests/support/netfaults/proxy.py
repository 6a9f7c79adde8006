"""A userspace fault proxy for MongoDB's wire protocol, between the workers and the server.

Why it exists: this kernel has no `netem` qdisc, so what nft cannot do to a link (delay,
jitter, reordering, duplicated or cut streams) happens here, one wire message at a time.
It also stands in for nft where network namespaces cannot be made: holding both directions
of a route is a partition, holding the replies only is a half-open connection.

What reaches an application over TCP is narrower than what happens to packets: the kernel
already re-orders and de-duplicates segments within a connection. So the faults are the
ones that survive TCP:

- `delay` / `jitter`: every message waits `delay + uniform(0, jitter)` seconds before it is
  forwarded. Order within a connection is kept (as TCP keeps it); across connections the
  jitter reorders writes, which is what a reordering network does to a server's clients.
- `hold`: nothing is forwarded either way until it is lifted (bytes wait in the kernel's
  buffers, as TCP retransmits them after a partition heals).
- `hold_replies`: requests pass and run, replies wait: a half-open connection; writes land
  while their callers time out.
- `duplicate`: that share of write commands (insert, update, delete, findAndModify) is sent
  to the server twice and runs twice; the caller gets one of the two replies (the first or
  the second, at random), as after a retransmitting middlebox or a resending client.
- `cut`: that share of messages is forwarded only in part, then both connections close: a
  request cut short never runs, a reply cut short leaves its caller not knowing.

Every fault that acts is counted per route (`Counters`), so a test can assert its fault fired.
The proxy runs its own event loop in a thread; its methods are safe to call from any thread.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional

OP_MSG = 2013
WRITES = frozenset({b"insert", b"update", b"delete", b"findAndModify"})
SLOW = 1.0  # seconds: a reply this late counts in `slow_replies`
WRITES_KEPT = 200_000  # a route's writes remembered for `stalled`, far more than a run sends
HEADER = struct.Struct("<iiii")  # messageLength, requestID, responseTo, opCode
# OP_MSG flag bits after which a reply is not one-for-one with its request
MORE_TO_COME, EXHAUST_ALLOWED = 1 << 1, 1 << 16


@dataclass
class Faults:
    """What a route does to the messages it carries (all off: a plain relay)."""

    hold: bool = False
    hold_replies: bool = False
    delay: float = 0.0
    jitter: float = 0.0
    duplicate: float = 0.0
    cut: float = 0.0


@dataclass
class Counters:
    """What a route's faults did, for the test to assert on."""

    connections: int = 0
    requests: int = 0
    replies: int = 0
    delayed: int = 0  # messages the proxy made late by its `delay`
    reordered: int = 0  # requests forwarded after one that reached the proxy later (the jitter)
    held: int = 0
    duplicated: int = 0
    duplicate_replies_dropped: int = 0
    cut: int = 0
    cut_requests: int = 0
    cut_replies: int = 0
    # what the server did, as seen on the route (the evidence of server-side faults)
    server_closed: int = 0  # connections the server closed under a live client
    slow_replies: int = 0  # replies that came SLOW seconds or more after their request, or never
    error_labels: int = 0  # replies carrying errorLabels
    write_concern_errors: int = 0
    not_primary: int = 0  # replies refusing a write for want of a primary

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class Route:
    name: str
    listen: tuple[str, int]
    upstream: tuple[str, int]
    source: Optional[str]  # the local address upstream connections are made from
    faults: Faults = field(default_factory=Faults)
    counters: Counters = field(default_factory=Counters)
    released: Optional[asyncio.Event] = None  # set while nothing holds the route
    replies_released: Optional[asyncio.Event] = None
    server: Optional[asyncio.base_events.Server] = None
    links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = field(default_factory=set)
    arrived: int = 0  # requests read from the route's clients so far, all connections
    forwarded: int = -1  # the latest arrival number forwarded so far
    #: every write forwarded: [when it went to the server, when its reply came (None: not yet)]
    writes: deque[list[Optional[float]]] = field(default_factory=lambda: deque(maxlen=WRITES_KEPT))


def command_name(message: bytes) -> Optional[bytes]:
    """The first key of an OP_MSG's body (section kind 0): the command's name."""
    if len(message) < 22 or HEADER.unpack_from(message)[3] != OP_MSG or message[20] != 0:
        return None
    end = message.find(b"\x00", 26)
    return message[26:end] if end > 26 else None


def one_reply(message: bytes) -> bool:
    """An OP_MSG request the server answers exactly once (no exhaust, no moreToCome)."""
    flags = struct.unpack_from("<I", message, 16)[0] if len(message) >= 20 else MORE_TO_COME
    return not flags & (MORE_TO_COME | EXHAUST_ALLOWED)


async def read_message(reader: asyncio.StreamReader) -> Optional[bytes]:
    try:
        head = await reader.readexactly(4)
        (length,) = struct.unpack("<i", head)
        return head + await reader.readexactly(length - 4)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


class FaultProxy:
    """Routes (listen address -> server address), each with its own faults and counters."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.routes: dict[str, Route] = {}
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fault-proxy", daemon=True)
        self._thread.start()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    # --- the operator's side -------------------------------------------------------------

    def add_route(
        self, name: str, listen_host: str, upstream: tuple[str, int], *, source: Optional[str] = None
    ) -> tuple[str, int]:
        """Listen on `listen_host` (a free port) and relay to `upstream`; the address to use."""
        return self._call(self._add(name, listen_host, upstream, source))  # type: ignore[no-any-return]

    def set(self, name: str, **changes: Any) -> None:
        """Change some of a route's faults (`hold=True`, `delay=2.0`, ...)."""
        self._call(self._set(name, changes))

    def clear(self, name: Optional[str] = None) -> None:
        """Every fault off, on one route or on all."""
        for route in [self.routes[name]] if name else list(self.routes.values()):
            self._call(self._set(route.name, {f.name: f.default for f in fields(Faults)}))

    def counters(self, name: str) -> dict[str, int]:
        return self.routes[name].counters.as_dict()

    def growth(self, name: str, counter: str) -> Callable[[], int]:
        """A reader of how much `counter` of route `name` has grown since this call."""
        before = self.counters(name)[counter]
        return lambda: self.counters(name)[counter] - before

    def unset(self, name: str, *keys: str) -> None:
        """Turn the faults `keys` of a route off, leaving its others as they are."""
        defaults = {f.name: f.default for f in fields(Faults)}
        self._call(self._set(name, {key: defaults[key] for key in keys}))

    def stalled(self, name: str, since: float, until: float, slow: float = SLOW) -> int:
        """Writes route `name` forwarded between `since` and `until - slow` (`time.monotonic()`)
        that had no reply by `until`: a server that answers in milliseconds held them `slow`
        seconds or more. Read at `until`, this is what a stall in that window did to the
        route's own traffic."""
        return self._call(self._stalled(name, since, until, slow))  # type: ignore[no-any-return]

    def drop_connections(self, name: str) -> int:
        """Close every connection of a route at once (a link taken down, on loopback)."""
        return self._call(self._drop(name))  # type: ignore[no-any-return]

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self._call(self._close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()

    # --- inside the loop -----------------------------------------------------------------

    async def _add(self, name: str, host: str, upstream: tuple[str, int], source: Optional[str]) -> tuple[str, int]:
        route = Route(name, (host, 0), upstream, source)
        route.released, route.replies_released = asyncio.Event(), asyncio.Event()
        route.released.set()
        route.replies_released.set()
        route.server = await asyncio.start_server(lambda r, w: self._accept(route, r, w), host, 0)
        route.listen = route.server.sockets[0].getsockname()[:2]
        self.routes[name] = route
        return route.listen

    async def _set(self, name: str, changes: dict[str, Any]) -> None:
        route = self.routes[name]
        for key, value in changes.items():
            if not hasattr(route.faults, key):
                raise ValueError(f"no fault named {key!r}")
            setattr(route.faults, key, value)
        assert route.released is not None and route.replies_released is not None
        (route.released.clear if route.faults.hold else route.released.set)()
        (route.replies_released.clear if route.faults.hold_replies else route.replies_released.set)()

    async def _stalled(self, name: str, since: float, until: float, slow: float) -> int:
        writes = self.routes[name].writes
        return sum(
            1
            for sent, answered in writes
            if sent is not None and since <= sent <= until - slow and (answered is None or answered > until)
        )

    async def _drop(self, name: str) -> int:
        route = self.routes[name]
        links = list(route.links)
        for pair in links:
            for writer in pair:
                writer.transport.abort()
        return len(links)

    async def _close(self) -> None:
        for route in self.routes.values():
            if route.server is not None:
                route.server.close()
            await self._drop(route.name)
        # the relays of connections that were still open end with their sockets
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    async def _accept(self, route: Route, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(
                *route.upstream, local_addr=(route.source, 0) if route.source else None
            )
        except OSError:
            writer.transport.abort()
            return
        for w in (writer, up_writer):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        route.counters.connections += 1
        pair = (writer, up_writer)
        route.links.add(pair)
        duplicated: dict[int, str] = {}  # requestID -> which reply the caller gets ("first" / "last")
        sent: dict[int, float] = {}  # requestID -> when it went to the server
        spans: dict[int, list[Optional[float]]] = {}  # requestID -> its entry in `route.writes`
        try:
            requests = asyncio.create_task(self._requests(route, reader, up_writer, duplicated, pair, sent, spans))
            replies = asyncio.create_task(self._replies(route, up_reader, writer, duplicated, pair, sent, spans))
            await asyncio.wait({requests, replies}, return_when=asyncio.FIRST_COMPLETED)
            if replies.done() and not requests.done() and not writer.is_closing():
                route.counters.server_closed += 1  # the server hung up on a client still there
            # writes still unanswered SLOW seconds on when the connection ends: the client gave
            # up (its socket timeout) on a reply the server held back, a blocking fail point
            # longer than that timeout shows only so
            now = self.loop.time()
            route.counters.slow_replies += sum(1 for at in sent.values() if now - at >= SLOW)
            for w in pair:
                w.transport.abort()
            await asyncio.gather(requests, replies, return_exceptions=True)
        finally:
            route.links.discard(pair)
            for w in pair:
                w.transport.abort()

    async def _wait(self, route: Route, replies: bool) -> None:
        gate = route.replies_released if replies else route.released
        assert gate is not None and route.released is not None
        if not gate.is_set() or not route.released.is_set():
            route.counters.held += 1
            await route.released.wait()
            await gate.wait()

    async def _pace(self, route: Route) -> None:
        pause = route.faults.delay + (self.rng.uniform(0, route.faults.jitter) if route.faults.jitter else 0.0)
        if route.faults.delay > 0:
            route.counters.delayed += 1
        if pause > 0:
            await asyncio.sleep(pause)

    def _cut(self, route: Route, message: bytes, out: asyncio.StreamWriter, pair: tuple[Any, Any]) -> bool:
        """Forward the first part of `message` and close both ends, if the dice say so."""
        if not route.faults.cut or self.rng.random() >= route.faults.cut:
            return False
        route.counters.cut += 1
        out.write(message[: max(1, len(message) // 2)])
        for w in pair:
            w.transport.abort()
        return True

    async def _requests(
        self,
        route: Route,
        reader: asyncio.StreamReader,
        out: asyncio.StreamWriter,
        duplicated: dict[int, str],
        pair: tuple[Any, Any],
        sent: dict[int, float],
        spans: dict[int, list[Optional[float]]],
    ) -> None:
        while True:
            message = await read_message(reader)
            if message is None:
                return
            arrival = route.arrived
            route.arrived += 1
            await self._wait(route, replies=False)
            await self._pace(route)
            if arrival < route.forwarded:
                route.counters.reordered += 1  # a later request, on another connection, went first
            route.forwarded = max(route.forwarded, arrival)
            route.counters.requests += 1
            if self._cut(route, message, out, pair):
                route.counters.cut_requests += 1
                return
            out.write(message)
            if command_name(message) in WRITES:  # not hello or getMore: those wait on purpose
                request_id = HEADER.unpack_from(message)[1]
                sent[request_id] = self.loop.time()
                spans[request_id] = span = [time.monotonic(), None]
                route.writes.append(span)
            if (
                route.faults.duplicate
                and command_name(message) in WRITES
                and one_reply(message)
                and self.rng.random() < route.faults.duplicate
            ):
                duplicated[HEADER.unpack_from(message)[1]] = self.rng.choice(("first", "last"))
                route.counters.duplicated += 1
                out.write(message)
            await out.drain()

    def _observe(self, route: Route, message: bytes, asked: Optional[float]) -> None:
        """Count what a reply shows of the server's faults (bytes, not a parse: cheap)."""
        c = route.counters
        if asked is not None and self.loop.time() - asked >= SLOW:
            c.slow_replies += 1
        c.error_labels += b"errorLabels" in message
        c.write_concern_errors += b"writeConcernError" in message
        c.not_primary += b"NotWritablePrimary" in message or b"not primary" in message

    async def _replies(
        self,
        route: Route,
        reader: asyncio.StreamReader,
        out: asyncio.StreamWriter,
        duplicated: dict[int, str],
        pair: tuple[Any, Any],
        sent: dict[int, float],
        spans: dict[int, list[Optional[float]]],
    ) -> None:
        seen: dict[int, bytes] = {}  # the first reply to a duplicated request, while the second is due
        while True:
            message = await read_message(reader)
            if message is None:
                return
            response_to = HEADER.unpack_from(message)[2]
            self._observe(route, message, sent.pop(response_to, None))
            span = spans.pop(response_to, None)
            if span is not None:
                span[1] = time.monotonic()
            if response_to in duplicated:
                if response_to not in seen:  # the first of two replies
                    seen[response_to] = message
                    if duplicated[response_to] == "last":
                        continue  # the caller gets the second one
                else:  # the second
                    first = seen.pop(response_to)
                    keep = duplicated.pop(response_to)
                    route.counters.duplicate_replies_dropped += 1
                    if keep == "first":
                        continue
                    del first  # the caller gets this one instead
            await self._wait(route, replies=True)
            await self._pace(route)
            route.counters.replies += 1
            if self._cut(route, message, out, pair):
                route.counters.cut_replies += 1
                return
            out.write(message)
            await out.drain()
