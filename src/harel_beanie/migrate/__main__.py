"""`python -m harel_beanie.migrate up|down|status ...`: the same as `harel-beanie migrate ...`."""

from harel_beanie.migrate import main

raise SystemExit(main())
