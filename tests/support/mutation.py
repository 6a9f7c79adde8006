"""Planted faults: a function of the package recompiled with one piece of its source changed,
for as long as a test needs it, everywhere it is referenced.

Why this module exists: a test that guards a rule is only worth something if removing the rule
makes it fail. These tests plant the removal on the real source text (so a planted fault
stops applying, loudly, the day the code it names changes) and assert the guarding test
catches it.
"""

from __future__ import annotations

import inspect
import sys
import textwrap
from contextlib import contextmanager
from types import FunctionType, ModuleType
from typing import Any, Iterator, Optional


@contextmanager
def mutated(module: ModuleType, name: str, old: str, new: str) -> Iterator[None]:
    """`module.name` with `old` (found exactly once in its source) replaced by `new`; every
    module attribute that held the original (a `from ... import name`) holds the mutant. A
    method is named `Class.method`."""
    if "." in name:
        owner_name, name = name.split(".", 1)
        owner = getattr(module, owner_name)
        with _mutated_in(module, owner, name, old, new, holders=[(owner, name)]):
            yield
        return
    with _mutated_in(module, module, name, old, new, holders=None):
        yield


@contextmanager
def _mutated_in(
    module: ModuleType, owner: Any, name: str, old: str, new: str, holders: Optional[list[tuple[Any, str]]]
) -> Iterator[None]:
    original = vars(owner)[name]
    assert isinstance(original, FunctionType), f"{module.__name__}.{name} is not a function"
    source = textwrap.dedent(inspect.getsource(original))
    assert source.count(old) == 1, f"the planted fault no longer applies: {old!r} is not once in {name}"
    scope = dict(module.__dict__)
    exec(compile(source.replace(old, new), inspect.getsourcefile(original) or "<mutant>", "exec"), scope)
    mutant = scope[name]
    # the mutant's globals are a copy: point it at the module's own, so that it calls the
    # other functions of the module as they are (and mutated ones, when several are planted)
    mutant = FunctionType(mutant.__code__, module.__dict__, name, mutant.__defaults__, mutant.__closure__)
    mutant.__kwdefaults__ = original.__kwdefaults__
    holders = holders or [
        (m, attr)
        for m in list(sys.modules.values())
        if m is not None and getattr(m, "__name__", "").startswith(("harel_beanie", "tests"))
        for attr, value in list(vars(m).items())
        if value is original
    ]
    for m, attr in holders:
        setattr(m, attr, mutant)
    try:
        yield
    finally:
        for m, attr in holders:
            setattr(m, attr, original)
