"""`python -m harel_beanie`: the `harel-beanie` command line (see `harel_beanie.commands.cli`)."""

import sys

from harel_beanie.commands.cli import main

sys.exit(main())
