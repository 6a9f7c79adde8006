"""The bounds of every lease, park and wait a caller of the transport sets.

Why this module exists: the transport enforces them and the command line's flags name them in
their help and refuse past them; kept here, free of the driver, the command line reads them
without importing the transport.

Upper bounds on every lease, park and wait a caller sets. A message leased or parked for
longer than any worker lives is stranded with no one to redeliver it, and a wait past the
worker's own shutdown keeps it from stopping; a caller's 1e308 must be refused, not obeyed.
"""

from __future__ import annotations

#: the longest lease a claim takes (`visibility`, `--visibility`): a day
MAX_VISIBILITY = 86400.0
#: the longest a nack parks a message (`delay`): a week
MAX_PARK = 7 * 86400.0
#: the longest an idle claim waits for a wake-up (`idle_wait`, `--idle-wait`): an hour
MAX_IDLE_WAIT = 3600.0
#: the longest an idle claim goes between looks without a change stream (`poll_interval`)
MAX_POLL_INTERVAL = 60.0
