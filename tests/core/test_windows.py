"""Windows on a numeric key (harel_beanie.core.windows) and which server a read talks to
(harel_beanie.queries.server): no I/O but the last test's.

A walk's windows tile the key from its upper bound down (none overlaps, none is skipped, the
last is open below), and each holds about the target once the walk has seen the density:
checked against random keys, clustered and spread, by replaying a walk over a sorted list."""

from __future__ import annotations

import bisect
import random

import pytest

from harel_beanie.core.windows import DownwardWalk, UpwardWalk, position_uppers
from harel_beanie.queries.server import MONGOD, SECANTUS, server_from, server_of


def _replay(keys: list[float], high: float, target: int, width: float) -> list[tuple[float | None, float, int]]:
    """The windows a walk takes over `keys` (sorted), with how many each held."""
    walk, out = DownwardWalk(high, target=target, width=width), []
    while not walk.done:
        w = walk.next()
        lo = 0 if w.low is None else bisect.bisect_left(keys, w.low)
        n = bisect.bisect_left(keys, w.high) - lo
        out.append((w.low, w.high, n))
        walk.saw(n)
    return out


@pytest.mark.parametrize("seed", range(20))
def test_windows_tile_the_key_and_hold_about_the_target(seed: int) -> None:
    rnd = random.Random(seed)
    high = 1_800_000_000.0
    if seed % 2:  # spread over a year, evenly
        keys = sorted(high - rnd.random() * 365 * 86400 for _ in range(5_000))
    else:  # bursts: a few busy hours over a month, with equal keys among them
        starts = [high - rnd.random() * 30 * 86400 for _ in range(5)]
        keys = sorted(round(s - rnd.random() * 3600, 1) for s in starts for _ in range(1_000))
    target = rnd.choice([20, 100, 500])
    windows = _replay(keys, high, target, width=rnd.choice([0.01, 1.0, 3600.0]))
    assert windows[0][1] == high and windows[-1][0] is None
    for (low, _, _), (_, next_high, _) in zip(windows, windows[1:]):
        assert low == next_high  # each starts where the last ended
    assert sum(n for _, _, n in windows) == len(keys)  # so every key is in exactly one
    if seed % 2:  # an even density: past the first few, every window holds about the target
        held = [n for _, _, n in windows if n]
        assert max(held[3:]) <= 4 * target, held


def test_a_walk_checks_its_arguments() -> None:
    with pytest.raises(ValueError):
        DownwardWalk(1.0, target=10, width=0.0)
    with pytest.raises(TypeError):
        DownwardWalk(1.0, target="10", width=1.0)  # type: ignore[arg-type]
    walk = DownwardWalk(1.0, target=10, width=5.0)
    with pytest.raises(RuntimeError):
        walk.saw(0)  # before a window was taken
    assert walk.next().low is None  # below the floor at once: open below
    walk.saw(3)
    assert walk.done
    with pytest.raises(RuntimeError):
        walk.next()


def test_the_server_is_told_by_its_build_info() -> None:
    assert server_from({"version": "8.2.11", "secantusVersion": "0.7.0b3"}) is SECANTUS
    assert server_from({"version": "7.0.4"}) is MONGOD and server_from({}) is MONGOD
    assert SECANTUS.hints_help is False and SECANTUS.limit_bounds_work is False


async def test_the_server_of_a_collection_is_the_one_the_tests_run_on(astore, mongo_url: str) -> None:
    import os

    found = await server_of(astore._colls["executions"])
    assert found is (MONGOD if os.environ.get("MONGODB_URL") else SECANTUS)


@pytest.mark.parametrize("seed", range(10))
def test_string_windows_widen_above_their_anchor_to_the_end(seed: int) -> None:
    rnd = random.Random(seed)
    alphabet = rnd.choice(["0123456789abcdef", "abc-XYZ/ ", "日本語é\u0301🙂\x00~\x7f\U0010ffff"])
    anchor = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 12)))
    deepest = rnd.randint(0, 40)
    bounds = list(position_uppers(anchor, deepest))
    assert bounds[-1] == (-1, None)  # the last is open above
    uppers = [b for _, b in bounds[:-1]]
    assert all(b is not None and b > anchor for b in uppers)
    assert uppers == sorted(set(uppers))  # each above the last: windows from one to the next tile the key
    positions = [p for p, _ in bounds[:-1]]
    assert positions == sorted(set(positions), reverse=True)  # leftward, a whole position a step
    for p, upper in bounds[:-1]:  # each holds what shares the anchor's first p characters
        assert upper is not None and upper[:p] == anchor[:p] and len(upper) == p + 1
    # every position from the deepest one leftward is taken, but one whose character has no
    # successor (the last code point)
    top = min(deepest, len(anchor) - 1)
    assert set(positions) == {p for p in range(top + 1) if anchor[p] != "\U0010ffff"}


def _replay_up(
    keys: list[float], low: float, high: float | None, target: int, width: float
) -> list[tuple[float, float | None, int]]:
    walk, out = UpwardWalk(low, target=target, width=width, high=high), []
    while not walk.done:
        w = walk.next()
        assert w.low is not None
        lo = bisect.bisect_left(keys, w.low)
        n = (len(keys) if w.high is None else bisect.bisect_left(keys, w.high)) - lo
        out.append((w.low, w.high, n))
        walk.saw(n)
        assert len(out) < 5_000  # a walk ends
    return out


@pytest.mark.parametrize("seed", range(20))
def test_upward_windows_tile_the_key_and_hold_about_the_target(seed: int) -> None:
    rnd = random.Random(seed)
    low = 1_800_000_000.0
    if seed % 2:  # timers spread over the coming week
        keys = sorted(low + rnd.random() * 7 * 86400 for _ in range(5_000))
    else:  # bursts, with equal keys among them
        starts = [low + rnd.random() * 30 * 86400 for _ in range(5)]
        keys = sorted(round(s + rnd.random() * 3600, 1) for s in starts for _ in range(1_000))
    target = rnd.choice([10, 100, 500])
    high = rnd.choice([None, low + 3 * 86400])
    windows = _replay_up(keys, low, high, target, width=rnd.choice([0.01, 1.0, 3600.0]))
    assert windows[0][0] == low and windows[-1][1] is None  # from `low`, the last open above
    for (_, high_, _), (next_low, _, _) in zip(windows, windows[1:]):
        assert high_ == next_low  # each starts where the last ended
    assert sum(n for _, _, n in windows) == len(keys)  # every key at or above `low` in exactly one
    if high is not None:
        assert all(h is None or h < high for _, h, _ in windows)  # none reaches past the read's bound
    if seed % 2 and high is None:
        held = [n for _, _, n in windows if n]
        assert max(held[3:-1] or [0]) <= 4 * target, held


def test_an_upward_walk_over_nothing_ends() -> None:
    windows = _replay_up([], 0.0, None, 10, 1.0)
    assert 20 < len(windows) < 40 and windows[-1][1] is None  # doubling until past `widest`
    with pytest.raises(ValueError):
        UpwardWalk(0.0, target=10, width=-1.0)
