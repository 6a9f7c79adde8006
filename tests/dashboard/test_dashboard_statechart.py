"""The execution page's statechart, as the Mermaid text the page hands the browser, on the shop's
own models (no server, no browser: tests/dashboard/test_dashboard_browser_views.py checks the drawing):

- every state is declared once, inside its own composite, before any edge; a final state
  keeps its name; a top-level state first named inside a composite (payment's `Declined`,
  reached from `Charging.Authorizing`) is drawn at the top level, and each edge in the
  innermost composite holding both its ends, so Mermaid never moves a state;
- the marks: the active leaves and their ancestors, a fork's regions, the visited states (not
  also active), the last transition's ends, the states that started children;
- a large model draws each composite that is neither active nor visited as one box;
- an execution whose definition the dashboard cannot load shows its known states as text.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from harel_beanie.dashboard import views
from harel_beanie.dashboard.statechart import Marks, render, spawned_from, state_paths
from harel_beanie.deploy.loader import default_models_dir, load_models


@pytest.fixture(scope="module")
def shop() -> dict[str, Any]:
    return load_models(default_models_dir())


def _parse(source: str) -> dict[str, Any]:
    """The drawing's structure: each state's label and the composite it is declared in (by
    id, "" for the top level), each edge with the composite it is drawn in, the classes."""
    declared: dict[str, tuple[str, str]] = {}
    edges: list[tuple[str, str, str]] = []
    classes: dict[str, set[str]] = {}
    open_: list[str] = [""]
    for line in source.splitlines()[1:]:
        text = line.strip()
        if m := re.fullmatch(r'state "([^"]*)" as (s\d+)( \{)?', text):
            assert m.group(2) not in declared, f"{m.group(2)} declared twice"
            declared[m.group(2)] = (m.group(1), open_[-1])
            if m.group(3):
                open_.append(m.group(2))
        elif text == "}":
            open_.pop()
        elif m := re.fullmatch(r"(s\d+|\[\*\]) --> (s\d+|\[\*\])( : .*)?", text):
            edges.append((m.group(1), m.group(2), open_[-1]))
        elif m := re.fullmatch(r"class ([s\d,]+) (\w+)", text):
            classes[m.group(2)] = set(m.group(1).split(","))
    assert open_ == [""], "a composite left open"
    return {"declared": declared, "edges": edges, "classes": classes}


def _within(declared: dict[str, tuple[str, str]], sid: str, composite: str) -> bool:
    """Whether state `sid` is declared in `composite` or in a composite inside it."""
    at = sid
    while at:
        at = declared[at][1]
        if at == composite:
            return True
    return composite == ""


def _ids(parsed: dict[str, Any]) -> dict[str, str]:
    return {label.split(" (")[0]: sid for sid, (label, _) in parsed["declared"].items()}


def test_every_state_is_declared_once_in_its_own_composite_and_finals_keep_their_names(shop: dict[str, Any]) -> None:
    for name, defn in [*shop.items(), *shop["Order"].submachines.items()]:
        parsed = _parse(render(defn, Marks()))
        declared, ids = parsed["declared"], _ids(parsed)
        assert len(declared) == len(state_paths(defn)), name  # every state, once
        for node_path in state_paths(defn):
            parent = node_path.rsplit(".", 1)[0] if "." in node_path else ""
            sid = ids[node_path.rsplit(".", 1)[-1]]
            assert declared[sid][1] == (ids[parent.rsplit(".", 1)[-1]] if parent else ""), (name, node_path)
        for a, b, composite in parsed["edges"]:  # drawn where both ends live: Mermaid moves nothing
            for end in (a, b):
                assert end == "[*]" or _within(declared, end, composite), (name, a, b, composite)
    payment = _parse(render(shop["Payment"], Marks()))
    ids = _ids(payment)
    for final in ("Captured", "Declined", "GaveUp", "Voided"):
        assert final in ids and (ids[final], "[*]", "") in payment["edges"], final
        assert ids[final] in payment["classes"]["final"]
    assert payment["declared"][ids["Declined"]][1] == ""  # top level, though Charging names it first
    assert (ids["Authorizing"], ids["Declined"], "") in payment["edges"]


def test_the_marks_light_the_active_configuration_the_trace_and_the_last_transition(shop: dict[str, Any]) -> None:
    marks = Marks(
        active={"Fulfilment", "Fulfilment.Warehouse.Packing", "Fulfilment.Invoicing.Issued"},
        visited={"Reserving", "Paying", "CoolingOff", "Fulfilment"},
        last=("CoolingOff", "Fulfilment"),
        spawned={"Paying": 1, "Fulfilment.Warehouse.Picking": 2},
    )
    parsed = _parse(render(shop["Order"], marks))
    ids, classes = _ids(parsed), parsed["classes"]
    named = {sid: label for sid, (label, _) in parsed["declared"].items()}
    lit = {named[sid].split(" (")[0] for sid in classes["active"]}
    assert lit == {"Fulfilment", "Warehouse", "Packing", "Invoicing", "Issued"}  # leaves and ancestors
    assert {named[sid] for sid in classes["visited"]} == {"Reserving", "Paying (1 child)", "CoolingOff"}
    assert classes["lastfrom"] == {ids["CoolingOff"]} and classes["lastto"] == {ids["Fulfilment"]}
    assert named[ids["Picking"]] == "Picking (2 children)"


def test_a_large_model_draws_its_quiet_composites_as_one_box_each(shop: dict[str, Any]) -> None:
    order = shop["Order"]
    small = _parse(render(order, Marks(active={"Paying"}), collapse_over=5))
    labels = {label for label, _ in small["declared"].values()}
    fulfilment = next(label for label in labels if label.startswith("Fulfilment"))
    inner = [p for p in state_paths(order) if p.startswith("Fulfilment.")]
    assert fulfilment == f"Fulfilment ({len(inner)} states)"
    assert not labels & {"Warehouse", "Invoicing", "Picking", "Issued"}  # drawn inside the one box
    # the composite the execution is in stays open, and a model under the bound is drawn whole
    opened = _parse(render(order, Marks(active={"Fulfilment.Warehouse.Packing"}), collapse_over=5))
    assert {"Fulfilment", "Warehouse", "Packing"} <= {label for label, _ in opened["declared"].values()}
    assert len(_parse(render(order, Marks()))["declared"]) == len(state_paths(order))


def test_an_unknown_definition_shows_its_known_states_as_text() -> None:
    row = views.ExecutionOut(id="o-1", definition_id="NotLoaded", status="RUNNING", active_path="B.C", version=3)
    kid = views.ExecutionOut(id="o-1:A:0", definition_id="Other", status="DONE", parent_id="o-1", version=1)
    steps = [views.StepOut(index=0, from_path=None, to_path="A"), views.StepOut(index=1, from_path="A", to_path="B.C")]
    out = views.diagram(row, [kid], steps, {})
    assert not out.definition_known and out.source is None
    assert out.paths == ["A", "B.C"] and out.active == ["B.C"] and out.children_by_state == {"A": ["o-1:A:0"]}
    assert (out.last_from, out.last_to) == ("A", "B.C")
    assert spawned_from("o-1", "o-1:A:0") == "A" and spawned_from("o-1", "o-12:A:0") is None
