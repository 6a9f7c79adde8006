"""Hypothesis strategies of hostile values: what a request, an upstream system or a careless
caller may hand a door instead of the plain value it takes.

Operator mappings and Beanie expressions (over the app's own Document classes too), `$`-
prefixed strings, lists, bools, NaN and infinities, huge ints, `str` subclasses that lie about
equality, bytes, unicode (lone surrogates included), and the empty ones.
"""

from __future__ import annotations

import math
from typing import Any

from beanie import Document
from beanie.odm.operators.find.comparison import GT, NE, Eq, In
from beanie.odm.operators.find.evaluation import RegEx
from hypothesis import strategies as st

from tests.support.fuzz_strategies import SPECIAL, clean_text, with_surrogate


class Customer(Document):
    """A Document class of the app's own: its expressions are not the store's values."""

    name: str = ""
    n: int = 0


class Liar(str):
    """A str that claims to equal everything (and hashes alike): a value that passes an
    `isinstance(str)` check but would fool any comparison made with it."""

    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    __hash__ = str.__hash__


OPERATORS = ["$gt", "$gte", "$lt", "$ne", "$in", "$nin", "$exists", "$regex", "$where", "$expr", "$function", "$type"]

operator_mapping = st.dictionaries(
    st.sampled_from(OPERATORS),
    st.one_of(st.none(), st.booleans(), st.integers(), clean_text, st.lists(clean_text, max_size=2)),
    min_size=1,
    max_size=2,
)
# Beanie's query operators over the app's own document's fields (by name: the class is never
# initialised here), as `Customer.name == "x"` builds them
beanie_expression = st.sampled_from(
    [Eq("name", "x"), NE("name", None), GT("n", 0), In("name", ["a", "b"]), RegEx("name", ".*")]
)
dollar_text = clean_text.map(lambda s: "$" + s)
special_text = st.lists(st.sampled_from(SPECIAL), min_size=1, max_size=6).map("".join)
liar = clean_text.map(Liar)
numbers_not_finite = st.sampled_from([math.nan, math.inf, -math.inf, -math.nan])
huge_int = st.one_of(st.integers(min_value=2**63), st.integers(max_value=-(2**63) - 1))
empties = st.sampled_from(["", {}, [], (), None, b"", set()])

#: everything above, for any parameter
hostile: st.SearchStrategy[Any] = st.one_of(
    operator_mapping,
    beanie_expression,
    dollar_text,
    special_text,
    st.lists(clean_text, max_size=3),
    st.tuples(clean_text),
    st.booleans(),
    numbers_not_finite,
    huge_int,
    st.integers(-5, 5),
    st.floats(allow_nan=False, allow_infinity=False),
    liar,
    st.binary(max_size=4),
    with_surrogate(),
    clean_text,
    empties,
    st.sampled_from([Customer, object, type, str]),
)
