"""A stand-in server for the fault-evidence tests: it answers each wire message with one reply.

    python -m tests.support.netfaults.echo PORT

Why it exists: the tests of the evidence itself (tests/reliability/test_reliability_network.py) need a
server the proxy relays to, that the test can stop with SIGSTOP, and that starts in well
under a second; the messages' contents do not matter, only that each request gets its reply
(`responseTo` set to its `requestID`). `message()` makes a request the proxy counts as a
write, `ask()` sends one and waits for its reply.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys

import bson

from tests.support.netfaults.proxy import HEADER, OP_MSG, read_message


def message(request_id: int, command: str = "insert") -> bytes:
    """An OP_MSG whose command is `command` (a write, for the proxy, when it is one)."""
    body = struct.pack("<I", 0) + b"\x00" + bson.encode({command: "c", "$db": "evidence"})
    return HEADER.pack(HEADER.size + len(body), request_id, 0, OP_MSG) + body


def ask(address: tuple[str, int], request_id: int = 1, timeout: float = 10.0) -> bytes:
    """Send one request to `address` and return its reply."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(message(request_id))
        head = sock.recv(4, socket.MSG_WAITALL)
        (length,) = struct.unpack("<i", head)
        return head + sock.recv(length - 4, socket.MSG_WAITALL)


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while (request := await read_message(reader)) is not None:
        length, request_id, _to, op = HEADER.unpack_from(request)
        writer.write(HEADER.pack(length, request_id + 1, request_id, op) + request[HEADER.size :])
        await writer.drain()
    writer.close()


async def serve(port: int) -> None:
    server = await asyncio.start_server(_answer, "127.0.0.1", port)
    print("ready", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
