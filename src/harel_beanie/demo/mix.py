"""The demo's shop workload: the scenarios `harel-beanie demo` cycles through the models in
`models/`, each with what its root execution is created with, the events the demo sends it,
how many executions it makes and the final state its model must end it in.

Why this module exists: the mix is the shop's story, told in the models' own vocabulary
(contexts, event kinds, outcomes, timer windows); the run (`harel_beanie.demo.run`) only drives
it, phase by phase, so a scenario is added or changed here. What it runs:

- orders that are paid, cool off for 15 minutes, fan their lines out to pickers, join,
  are sealed, scanned twice and delivered (`Completed`);
- orders whose gateway fails a few times first (retries with exponential backoff on
  durable timers), refused cards (`PaymentFailed`), out-of-stock lines (`Unfulfilled`),
  orders cancelled while cooling off (`Cancelled`), parcels never delivered (`Lost` after
  a 7-day timer), and standalone payments whose gateway never answers (`GaveUp` when the
  2-minute budget runs out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harel.spec.states import Event

DAY = 86_400.0
# the simulated windows: payments (retries, a 2-minute budget), the 15-minute cooling-off and
# picking, then a week and ten minutes for the lost parcels' 7-day timers
PAY_WINDOW, FULFIL_WINDOW, LOST_WINDOW = 300.0, 1_200.0, 7 * DAY + 600.0
#: one batch of orders from creation to delivery
STORY = PAY_WINDOW + FULFIL_WINDOW
#: the shop time a run replays, ending at the real time it started: the orders whose parcels
#: get lost a week before (they need the week; their timers fire ten minutes before the rest
#: start), then every other order in the last `STORY` seconds, so that when a run ends all
#: but the lost orders' children (finished a week back) were last written in the last hour
SPAN = STORY + LOST_WINDOW + STORY


@dataclass(frozen=True)
class Scenario:
    """One root execution of the mix: what it is created with, what the demo does to it,
    and the final state the model must end it in."""

    name: str
    definition_id: str
    lines: tuple[str, ...] = ()
    card: str = "visa"
    flaky: int = 0
    cancel: bool = False  # cancelled while cooling off
    seal: bool = False  # the packing bench reports the parcel sealed
    deliver: bool = False  # carrier scans and delivery
    expect: str = ""

    @property
    def waits_a_week(self) -> bool:
        """Sealed and never delivered: it ends only when its 7-day timer fires."""
        return self.seal and not self.deliver

    @property
    def executions(self) -> int:
        """How many executions it creates: an order that reaches fulfilment has its payment,
        two regions and one picker per line."""
        if self.definition_id == "Payment":
            return 1
        if self.card == "blocked" or self.cancel:
            return 2
        return 4 + len(self.lines)

    def context(self, root_id: str) -> dict[str, Any]:
        """What its root execution is created with."""
        if self.definition_id == "Payment":
            return {"order_id": root_id, "amount": 42.0, "card": self.card, "flaky_attempts": self.flaky}
        amount = round(19.9 * max(1, len(self.lines)), 2)
        return {
            "order_id": root_id,
            "amount": amount,
            "lines": list(self.lines),
            "card": self.card,
            "flaky_attempts": self.flaky,
        }

    def sealed(self, root_id: str) -> Event:
        """The packing bench's report that the parcel is sealed."""
        return Event(id=f"{root_id}:sealed", kind="ParcelSealed", data={"weight_g": 250 * len(self.lines)})

    def delivery(self, root_id: str) -> list[Event]:
        """The carrier's two hub scans, then the delivery, in this order."""
        scans = [Event(id=f"{root_id}:scan:{k}", kind="Scan", data={"hub": f"HUB-{k + 1}"}) for k in range(2)]
        return [*scans, Event(id=f"{root_id}:delivered", kind="Delivered", data={"signed_by": "front desk"})]


# every kind of ending comes in the first 27 executions, so a small run shows them all
MIX: tuple[Scenario, ...] = (
    Scenario("delivered", "Order", ("SKU-1", "SKU-2"), seal=True, deliver=True, expect="Completed"),
    Scenario("gateway retried", "Order", ("SKU-3",), flaky=2, seal=True, deliver=True, expect="Completed"),
    Scenario("card declined", "Order", ("SKU-1",), card="blocked", expect="PaymentFailed"),
    Scenario("payment gave up", "Payment", flaky=99, expect="GaveUp"),
    Scenario("out of stock", "Order", ("SKU-2", "OOS-9"), expect="Unfulfilled"),
    Scenario("cancelled", "Order", ("SKU-1", "SKU-2"), cancel=True, expect="Cancelled"),
    Scenario("parcel lost", "Order", ("SKU-5",), seal=True, expect="Lost"),
    Scenario("delivered", "Order", ("SKU-4", "SKU-5", "SKU-6"), seal=True, deliver=True, expect="Completed"),
    Scenario("delivered", "Order", ("SKU-7",), seal=True, deliver=True, expect="Completed"),
    Scenario("gateway retried", "Order", ("SKU-8", "SKU-9"), flaky=3, seal=True, deliver=True, expect="Completed"),
    Scenario("delivered", "Order", ("SKU-1", "SKU-3"), seal=True, deliver=True, expect="Completed"),
)


def plan(executions: int) -> list[Scenario]:
    """The mix, cycled until it creates at least `executions` executions (at least one)."""
    out: list[Scenario] = []
    total = 0
    while total < executions or not out:
        s = MIX[len(out) % len(MIX)]
        out.append(s)
        total += s.executions
    return out


def root_id(run_id: str, i: int, s: Scenario) -> str:
    return f"{run_id}-{'order' if s.definition_id == 'Order' else 'payment'}-{i:04d}"
