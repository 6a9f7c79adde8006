"""The flags several commands share, and the one way a flag's value is checked.

Why this module exists: every command names its server the same way (`--url`, `--db`,
`--prefix`, the connect policy), and every number a flag takes is checked by the rule every
other door follows (`harel_beanie.core.arguments`), bounded, so a typo of a few digits is
refused rather than obeyed for ages. Each command module declares its own flags with these.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

from harel_beanie.core.arguments import BadArgument, parse_number, require_int, require_seconds
from harel_beanie.core.errors import ConfigError
from harel_beanie.core.limits import MAX_IDLE_WAIT

#: A day, in seconds: the bound of most waits a flag sets.
DAY = 86400.0


def checked(check: Callable[[str, str], Any]) -> Callable[[str], Any]:
    """An argparse `type` from a check of `harel_beanie.core.arguments`: argparse names the
    flag in its one-line error."""

    def parse(text: str) -> Any:
        try:
            return check("value", text)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("value ")) from None

    return parse


def value_of(flag: str, parse: Callable[[str], Any], text: str) -> Any:
    """`parse(text)`, its refusal re-worded to name `flag` as the user typed it (a parser
    of the library names its own parameter: `finished_before`, `age`)."""
    try:
        return parse(text)
    except BadArgument as exc:
        raise ConfigError(f"{flag} {str(exc).removeprefix(exc.argument + ' ')}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{flag}: {exc}") from None


def _whole(what: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{what} expected a whole number, got {text!r}") from None
    return require_int(what, value, low=1, high=2**31 - 1)


def seconds(high: float) -> Callable[[str], float]:
    """A flag of seconds above 0 and at most `high`."""
    return checked(lambda what, text: require_seconds(what, parse_number(what, text), positive=True, high=high))


def _port(what: str, text: str) -> int:
    return require_int(what, _whole(what, text), low=1, high=65535)


positive_int = checked(_whole)
#: a TCP port
port = checked(_port)
positive_float = seconds(DAY)
#: a ping's wait, as `RetryPolicy` bounds it
ping = seconds(60.0)


def connection(p: argparse.ArgumentParser, embedded: bool) -> None:
    """Where the data lives: the server, database, prefix and connect policy (and, for a
    command that may use it, the embedded server's folder)."""
    g = p.add_argument_group("where the data lives")
    fallback = ", else the embedded server)" if embedded else ")"
    g.add_argument("--url", help="MongoDB URL (default: $HAREL_MONGO_URL, then $MONGODB_URL" + fallback)
    g.add_argument("--db", help="database (default: $HAREL_MONGO_DB, else harel)")
    g.add_argument("--prefix", help="collection prefix (default: $HAREL_PREFIX, else harel)")
    if embedded:
        g.add_argument(
            "--data",
            metavar="DIR",
            help="the embedded server's folder when no URL is set (default: ./harel-beanie-data)",
        )
    g.add_argument(
        "--connect-attempts",
        type=positive_int,
        metavar="N",
        help="pings before giving up on the server (default 5, 0.5 s apart)",
    )
    g.add_argument(
        "--connect-timeout", type=ping, metavar="SECONDS", help="how long each ping waits for an answer (default 1)"
    )


def transport(p: argparse.ArgumentParser, *, idle_wait: bool = True) -> None:
    """Which transport a command runs on, and how long its idle claims wait."""
    p.add_argument(
        "--transport",
        choices=("beanie", "harel"),
        default=None,
        help="beanie: this package's transport (the default; $HAREL_BEANIE_TRANSPORT); harel: harel's Mongo transport",
    )
    if idle_wait:
        p.add_argument(
            "--idle-wait",
            type=seconds(MAX_IDLE_WAIT),
            default=1.0,
            metavar="SECONDS",
            help=f"the longest an idle claim waits for a wake-up on this package's transport (default 1, "
            f"at most {MAX_IDLE_WAIT:g})",
        )


def stuck_after(p: argparse.ArgumentParser, called: str) -> None:
    """How long a RUNNING execution may go silent with nothing to wake it, or hold an overdue
    timer, before it is `called` so (`harel_beanie.core.stuck`)."""
    p.add_argument(
        "--stuck-after",
        type=seconds(3650 * DAY),
        default=300.0,
        metavar="SECONDS",
        help=f"a RUNNING execution silent this long with no timer ahead and nothing pending, or holding a timer "
        f"overdue this long, is {called} (default 300)",
    )
