"""Actions of the shop workloads in this directory (`payment.stm`, `picking.stm`, `order.stm`).

The models bind them by dotted name (`shop_actions.<fn>`), so this directory has to be on
`sys.path`; `harel_beanie.deploy.loader.load_models` puts it there.

Every outcome is a pure function of the execution's context: the "gateway" fails the first
`flaky_attempts` authorisations, refuses a card named "blocked", and a SKU starting with
`OOS-` is out of stock. No clock, no randomness, no I/O — two runs of the same script give the
same executions on any store, which is what the differential tests and the benchmark rely on.
Values written to the context are plain JSON (str, int, float, bool, list, dict), as a
serialising store keeps them.
"""

from __future__ import annotations

from typing import Any


def _ctx(stm: Any) -> dict[str, Any]:
    ctx: dict[str, Any] = stm.execution_ctx
    return ctx


# --- Payment -------------------------------------------------------------------------------


def open_payment(stm: Any, event: Any, **kw: Any) -> None:
    """Start a payment: a hold reference, and the attempt counters from zero."""
    ctx = _ctx(stm)
    ctx["hold_ref"] = f"HOLD-{ctx['order_id']}"
    ctx["attempts"] = 0


def authorize(stm: Any, event: Any, **kw: Any) -> None:
    """One authorisation attempt against the (deterministic) gateway."""
    ctx = _ctx(stm)
    ctx["attempts"] = int(ctx.get("attempts", 0)) + 1
    if ctx.get("card") == "blocked":
        ctx["gateway_status"] = "blocked"
    elif ctx["attempts"] <= int(ctx.get("flaky_attempts", 0)):
        ctx["gateway_status"] = "unavailable"
    else:
        ctx["gateway_status"] = "approved"
        ctx["auth_code"] = f"AUTH-{ctx['order_id']}-{ctx['attempts']}"


def gateway_verdict(stm: Any, event: Any, **kw: Any) -> str:
    """Selector: route on the last attempt's gateway status."""
    return str(_ctx(stm)["gateway_status"])


def capture(stm: Any, event: Any, **kw: Any) -> None:
    ctx = _ctx(stm)
    ctx["payment_ref"] = f"PAY-{ctx['order_id']}"
    ctx["captured"] = ctx["amount"]


def void_hold(stm: Any, event: Any, **kw: Any) -> None:
    """Give the card hold back (payment abandoned: declined, timed out or cancelled)."""
    ctx = _ctx(stm)
    ctx["voided"] = ctx.get("hold_ref")
    ctx["payment_ref"] = None


# --- Picking (one instance per order line) ---------------------------------------------------


def pick_line(stm: Any, event: Any, **kw: Any) -> None:
    ctx = _ctx(stm)
    sku = str(ctx["sku"])
    ctx["in_stock"] = not sku.startswith("OOS-")
    ctx["bin"] = f"BIN-{sku}" if ctx["in_stock"] else None


def pick_result(stm: Any, event: Any, **kw: Any) -> str:
    """Selector: "picked" if the line's SKU was on the shelf, else "short"."""
    return "picked" if _ctx(stm)["in_stock"] else "short"


# --- Order -----------------------------------------------------------------------------------


def reserve_stock(stm: Any, event: Any, **kw: Any) -> None:
    ctx = _ctx(stm)
    ctx["reservation"] = f"RSV-{ctx['order_id']}"
    ctx["log"] = ["reserved"]


def release_stock(stm: Any, event: Any, **kw: Any) -> None:
    ctx = _ctx(stm)
    ctx["reservation"] = None
    ctx.setdefault("log", []).append("released")


def seal_parcel(stm: Any, event: Any, **kw: Any) -> None:
    """Warehouse region: the sealed parcel's id, from the `ParcelSealed` event's weight."""
    ctx = _ctx(stm)
    weight = (event.data or {}).get("weight_g", 0) if event is not None else 0
    ctx["parcel_id"] = f"PCL-{ctx['order_id']}-{len(ctx.get('lines', []))}"
    ctx["weight_g"] = weight


def issue_invoice(stm: Any, event: Any, **kw: Any) -> None:
    ctx = _ctx(stm)
    ctx["invoice_no"] = f"INV-{ctx['order_id']}"


def hand_to_carrier(stm: Any, event: Any, **kw: Any) -> None:
    ctx = _ctx(stm)
    results = ctx.get("region_results", {})
    warehouse: dict[str, Any] = next((r for key, r in results.items() if key.endswith("Warehouse")), {})
    ctx["tracking"] = f"TRK-{warehouse.get('parcel_id', ctx['order_id'])}"
    ctx.setdefault("log", []).append("shipped")


def notify_customer(stm: Any, event: Any, **kw: Any) -> None:
    ctx = _ctx(stm)
    ctx.setdefault("log", []).append(f"notified:{kw.get('template', 'generic')}")
