"""Hypothesis strategies for the reliability fuzz tests: the strings and values a caller
can hand the store, weighted towards the characters that mean something to MongoDB, to a
regular expression, to JSON or to the store's own path encoding."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# characters with a meaning somewhere on the way to the server, and code point boundaries
SPECIAL = [
    ".",
    "$",
    "\uff0e",
    "\uff05",
    "%",
    "2E",
    "25",
    "\x00",
    "\\",
    "*",
    "^",
    "[",
    "]",
    "(",
    ")",
    "?",
    "|",
    "+",
    "{",
    "}",
    '"',
    "'",
    ":",
    ",",
    " ",
    "\t",
    "\n",
    "\x7f",
    "é",
    "e\u0301",
    "日",
    "🙂",
    "\ud7ff",
    "\ue000",
    "\uffff",
    "\U0010ffff",
    "\u200b",
    "\ufeff",
]

piece = st.one_of(st.sampled_from(SPECIAL), st.characters(codec="utf-8"))  # utf-8: never a lone surrogate
clean_text = st.lists(piece, max_size=10).map("".join)
surrogate = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"])


@st.composite
def with_surrogate(draw: st.DrawFn) -> str:
    """A string holding at least one lone surrogate, which no BSON string can carry."""
    text = draw(clean_text)
    at = draw(st.integers(0, len(text)))
    return text[:at] + draw(surrogate) + text[at:]


# mostly storable strings, sometimes one with a lone surrogate
any_text = st.one_of(clean_text, clean_text, clean_text, with_surrogate())

# a small alphabet, so that drawn ids share prefixes and sort against each other
ID_ALPHABET = ["a", "b", ".", "\uff0e", "$", "\x00", "*", "\\", "é", "\U0010ffff", "\ud7ff", "\ue000", "\uffff", "A"]
close_ids = st.text(alphabet=st.sampled_from(ID_ALPHABET), max_size=5)

finite_float = st.floats(allow_nan=False, allow_infinity=False)
# a timer's fire time as the engine makes one (epoch seconds, or small test clocks). Not tiny
# magnitudes: the embedded server's index orders negative doubles nearer zero than about
# 1e-120 wrongly (a SecantusDB bug, docs/RELIABILITY.md), which the timer sweep's index query
# would inherit on that server only.
fire_time = st.one_of(
    st.integers(-(10**6), 10**10).map(float),
    st.floats(-1e9, 1e10, allow_nan=False).filter(lambda x: x == 0 or abs(x) >= 1e-9),
)
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(), finite_float, clean_text)
json_value = st.recursive(
    json_scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(clean_text, inner, max_size=4)),
    max_leaves=12,
)
json_object = st.dictionaries(clean_text, json_value, max_size=5)

# values that are not what a str / int parameter takes
not_a_str = st.one_of(
    st.integers(),
    st.floats(),
    st.booleans(),
    st.binary(max_size=4),
    st.dictionaries(
        st.sampled_from(["$gt", "$ne", "$exists", "$regex", "$where"]), json_scalar, min_size=1, max_size=2
    ),
    st.lists(clean_text, max_size=2),
)
not_an_int = st.one_of(
    st.floats(),
    st.booleans(),
    clean_text,
    st.none(),
    st.dictionaries(st.sampled_from(["$gt", "$ne", "$exists"]), st.integers(), min_size=1, max_size=1),
)


def has_surrogate(value: Any) -> bool:
    """True if a lone surrogate is anywhere in `value` (a str, or keys/items of containers)."""
    if isinstance(value, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, dict):
        return any(has_surrogate(k) or has_surrogate(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(has_surrogate(v) for v in value)
    return False


def oracle_budget(n: int) -> settings:
    """The write oracle's hypothesis settings: `n` examples, derandomized (a case's outcome
    never depends on a draw), no deadline (a real server's pace varies)."""
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    )
