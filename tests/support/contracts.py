"""harel's store contracts (`harel.testing`), named once: each test file runs the same three
(the listing, in `_id` order; the outbox; purge) on the stores it builds, as
`SYNC[name](store, ns)` or `await ASYNC[name](store, ns)`; `ns` prefixes every id a contract
writes, so it holds on a database shared with other data."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from harel.testing import (
    assert_async_listing_contract,
    assert_async_outbox_contract,
    assert_async_purge_contract,
    assert_listing_contract,
    assert_outbox_contract,
    assert_purge_contract,
)

SYNC: dict[str, Callable[[Any, str], None]] = {
    "listing": lambda store, ns: assert_listing_contract(store, ordered=True, ns=ns),
    "outbox": lambda store, ns: assert_outbox_contract(store, ns=ns),
    "purge": lambda store, ns: assert_purge_contract(store, ns=ns),
}

ASYNC: dict[str, Callable[[Any, str], Awaitable[None]]] = {
    "listing": lambda store, ns: assert_async_listing_contract(store, ordered=True, ns=ns),
    "outbox": lambda store, ns: assert_async_outbox_contract(store, ns=ns),
    "purge": lambda store, ns: assert_async_purge_contract(store, ns=ns),
}
