"""An execution's statechart as a Mermaid `stateDiagram-v2`, its active configuration and its
history marked: what the execution page draws (with the vendored `static/mermaid.min.js`).

Why this module exists: harel ships a renderer (`harel.viz.mermaid`) of a definition alone,
and on this project's models it draws a final state without its name and a top-level state
inside the composite that first mentions it. This one declares every state inside its own
composite before any transition, emits each transition in the innermost composite holding
both its ends, and draws the execution over the definition:

- `active`: every active state, leaves and their ancestors (a fork's regions are child
  executions: their active paths are passed in as well);
- `visited`: the states the trace passed through;
- `lastfrom` / `lastto`: the last transition's source and target;
- a state that spawned child executions says how many (the page lists and links them);
- a large model (more than `collapse_over` states) draws each composite that is neither
  active nor visited as one box, so the part that matters stays readable.

State ids in the diagram are `s0`, `s1`, ... (a state's path may hold any character);
labels are the states' names, escaped for Mermaid. Pure, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Optional

from harel.definition.model import Definition, Node, NodeKind
from harel.viz.mermaid import resolve_relative

CLASSES = (
    "classDef active fill:#dbeafe,stroke:#1d4ed8,stroke-width:3px,color:#0b3b9c",
    "classDef visited fill:#eef2f7,stroke:#94a3b8,color:#334155",
    "classDef lastfrom stroke:#b45309,stroke-width:3px,stroke-dasharray:4 2",
    "classDef lastto stroke:#b45309,stroke-width:3px",
    "classDef final font-weight:bold",
)


@dataclass
class Marks:
    """What the execution adds to its definition's drawing."""

    active: set[str] = field(default_factory=set)  # active paths (leaves); ancestors are added
    visited: set[str] = field(default_factory=set)
    last: Optional[tuple[Optional[str], Optional[str]]] = None  # the last transition: from, to
    spawned: dict[str, int] = field(default_factory=dict)  # state path -> child executions started there


def ancestors(path: str) -> Iterator[str]:
    """`a.b.c` -> `a.b.c`, `a.b`, `a`."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        yield ".".join(parts[:i])


def state_paths(defn: Definition) -> list[str]:
    """Every state's path, in declaration order: what the page lists when it cannot draw."""
    out: list[str] = []

    def walk(node: Node) -> None:
        for child in node.children:
            out.append(child.full_path)
            walk(child)

    walk(defn.root)
    return out


def _label(text: str) -> str:
    """A name as a Mermaid label: no quotes, no markup, no statement separators."""
    return "".join(ch if ch.isalnum() or ch in " _-.:/()" else " " for ch in text).strip() or "?"


class _Drawing:
    def __init__(self, defn: Definition, marks: Marks, collapse_over: int) -> None:
        self.defn = defn
        self.marks = marks
        self.ids: dict[str, str] = {}
        self.lit = {a for p in marks.active for a in ancestors(p)} | {a for p in marks.visited for a in ancestors(p)}
        self.collapsed: set[str] = set()
        if len(state_paths(defn)) > collapse_over:
            self.collapsed = {n.full_path for n in self._nodes(defn.root) if n.children and n.full_path not in self.lit}
        self.edges: dict[str, list[str]] = {}  # the composite an edge is drawn in -> its lines
        self.lines: list[str] = ["stateDiagram-v2"]

    def _nodes(self, node: Node) -> Iterator[Node]:
        for child in node.children:
            yield child
            yield from self._nodes(child)

    def shown(self, path: str) -> str:
        """The drawn state standing for `path`: itself, or the collapsed composite holding it."""
        for a in reversed(list(ancestors(path))):
            if a in self.collapsed:
                return a
        return path

    def sid(self, path: str) -> str:
        path = self.shown(path)
        if path not in self.ids:
            self.ids[path] = f"s{len(self.ids)}"
        return self.ids[path]

    def edge(self, source: str, target: Optional[str], label: str) -> None:
        """An edge, drawn in the innermost composite holding both its ends (so no state is
        pulled into a composite it does not belong to)."""
        a, b = self.shown(source), self.shown(target) if target is not None else None
        if b is None or a == b:
            return
        common: list[str] = []
        for x, y in zip(a.split(".")[:-1], b.split(".")[:-1]):
            if x != y:
                break
            common.append(x)
        text = f"{self.sid(a)} --> {self.sid(b)}" + (f" : {_label(label)}" if label else "")
        self.edges.setdefault(".".join(common), []).append(text)

    def collect(self, node: Node) -> None:
        for t in node.transitions:
            label = t.event_filter.kind if t.event_filter is not None else ""
            if t.selector is not None:
                for value, name in t.selector.mapper.items():
                    target = resolve_relative(node, name)
                    self.edge(t.source.full_path, target.full_path if target else None, f"{label} {value}".strip())
                if t.selector.default is not None:
                    target = resolve_relative(node, t.selector.default)
                    self.edge(t.source.full_path, target.full_path if target else None, f"{label} else".strip())
            elif t.choice is not None:
                for _, branch in t.choice.branches:
                    self.edge(t.source.full_path, branch.full_path, label)
                if t.choice.default is not None:
                    self.edge(t.source.full_path, t.choice.default.full_path, f"{label} else".strip())
            else:
                self.edge(t.source.full_path, t.target.full_path if t.target else None, label)
        for child in node.children:
            self.collect(child)

    def declare(self, node: Node, pad: str) -> None:
        """The states inside `node` (the root: the whole machine), then its own edges."""
        kids = node.children
        if node.kind is NodeKind.ORTHOGONAL:
            for i, region in enumerate(kids):
                if i:
                    self.lines.append(pad + "--")
                self.state(region, pad)
        else:
            if node.start_state:
                start = (
                    resolve_relative(node, node.start_state)
                    if node.full_path
                    else self.defn.index.get(node.start_state)
                )
                if start is not None:
                    self.lines.append(f"{pad}[*] --> {self.sid(start.full_path)}")
            for child in kids:
                self.state(child, pad)
        self.lines += [pad + line.strip() for line in self.edges.get(node.full_path, [])]

    def state(self, node: Node, pad: str) -> None:
        path = node.full_path
        name = node.name.rsplit(".", 1)[-1]
        spawned = self.marks.spawned.get(path, 0)
        label = _label(name) + (f" ({spawned} {'child' if spawned == 1 else 'children'})" if spawned else "")
        if node.children and path not in self.collapsed:
            self.lines.append(f'{pad}state "{label}" as {self.sid(path)} {{')
            self.declare(node, pad + "  ")
            self.lines.append(pad + "}")
            return
        if node.children:  # collapsed
            inner = sum(1 for _ in self._nodes(node))
            label += f" ({inner} states)"
        self.lines.append(f'{pad}state "{label}" as {self.sid(path)}')
        if node.outcome is not None and not node.children:
            self.lines.append(f"{pad}{self.sid(path)} --> [*]")

    def classes(self) -> None:
        m = self.marks
        active = {self.shown(a) for p in m.active for a in ancestors(p)}
        visited = {self.shown(a) for p in m.visited for a in ancestors(p)} - active
        marked = {
            "active": active,
            "visited": visited,
            "lastfrom": {self.shown(m.last[0])} if m.last and m.last[0] else set(),
            "lastto": {self.shown(m.last[1])} if m.last and m.last[1] else set(),
            "final": {n.full_path for n in self._nodes(self.defn.root) if n.outcome is not None and not n.children},
        }
        self.lines += ["  " + c for c in CLASSES]
        for name, paths in marked.items():
            ids = sorted({self.ids[p] for p in paths if p in self.ids})
            if ids:
                self.lines.append(f"  class {','.join(ids)} {name}")


def render(defn: Definition, marks: Marks, *, collapse_over: int = 40) -> str:
    """The Mermaid text of `defn` with `marks` drawn on it."""
    d = _Drawing(defn, marks, collapse_over)
    d.collect(defn.root)
    d.declare(defn.root, "  ")
    d.classes()
    return "\n".join(d.lines) + "\n"


def spawned_from(parent_id: str, child_id: str) -> Optional[str]:
    """The state a child execution was started from, read from its id (harel names a child
    `<parent>:<state path>:<n>`); None for an id of another shape."""
    if not child_id.startswith(parent_id + ":"):
        return None
    rest = child_id[len(parent_id) + 1 :]
    path, _, n = rest.rpartition(":")
    return path if path and n.isdigit() else None


def find_definition(definitions: dict[str, Definition], definition_id: str) -> Optional[Definition]:
    """`definition_id` among the registry's machines and their submachines (`pay.Payment`)."""
    if definition_id in definitions:
        return definitions[definition_id]
    for defn in definitions.values():
        sub = defn.submachines.get(definition_id)
        if sub is not None:
            return sub
    return None
