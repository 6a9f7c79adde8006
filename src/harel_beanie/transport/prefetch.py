"""The leases one claim took beyond the one it answers, kept for the worker's next claims.

Why this module exists: harel's worker claims one message per free slot, one call each, and
harel's transport protocol has no call for more. A claim of k groups costs about what a claim
of one does (`harel_beanie.transport.queues`, Rule 8), so the transport claims as many
groups as the worker has slots free and hands the others out on its next claims, without a
round trip. The worker's free slots are what the transport can count itself: its
concurrency (`prefetch`) less the leases it handed out and not yet acked or nacked, and those
it keeps, each counted until its lease ends (a worker that drops a lease without either frees
its slot then).

A kept lease is handed out only to a claim by the same worker id, while at least half the
visibility that claim asks for is left of it (its time runs while it waits), and to a claim
whose `min_priority` its group meets; otherwise it stays until its lease ends (then the group
is claimable again, as for any lease never acked) or the transport's `close()` gives it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from harel_beanie.transport.queues import QueueLease

#: the most groups `harel-beanie worker` lets one claim lease (its concurrency is 256 by
#: default): a kept lease's time runs while it waits for a slot, so a claim takes what the
#: worker starts on soon, not a quarter of a backlog
PREFETCH_CAP = 32


@dataclass
class Prefetch:
    """The kept leases and the slots in use, of one transport."""

    slots: int = 1
    kept: list[tuple[str, float, QueueLease]] = field(default_factory=list)  # (worker, until, lease)
    out: dict[tuple[str, str], float] = field(default_factory=dict)  # (group, token) -> until

    def room(self, now: float) -> int:
        """How many groups a claim may lease now: at least the one it answers."""
        self.out = {k: until for k, until in self.out.items() if until > now}
        self.kept = [(w, until, lease) for w, until, lease in self.kept if until > now]
        return max(1, self.slots - len(self.out) - len(self.kept))

    def keep(self, worker_id: str, leases: list[QueueLease], until: float) -> Optional[QueueLease]:
        """The first of `leases` handed out, the others kept; None if there are none."""
        if not leases:
            return None
        self.kept += [(worker_id, until, lease) for lease in leases[1:]]
        self.out[(leases[0].group_id, leases[0].token)] = until
        return leases[0]

    def take(self, worker_id: str, visibility: float, min_priority: int, now: float) -> Optional[QueueLease]:
        """A kept lease this claim may have, first in claim order, or None."""
        for i, (worker, until, lease) in enumerate(self.kept):
            if worker == worker_id and until - now >= visibility / 2 and lease.priority >= min_priority:
                del self.kept[i]
                self.out[(lease.group_id, lease.token)] = until
                return lease
        return None

    def done(self, lease: Any) -> None:
        """An ack or nack of a lease: its slot is free."""
        self.out.pop((str(getattr(lease, "group_id", "")), str(getattr(lease, "token", ""))), None)

    def drain(self) -> list[QueueLease]:
        """The kept leases, no longer kept: the transport gives them back."""
        leases = [lease for _, _, lease in self.kept]
        self.kept = []
        return leases
