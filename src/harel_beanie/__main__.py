"""`python -m harel_beanie`: the `harel-beanie` command line (see `harel_beanie.cli`)."""

import sys

from harel_beanie.cli import main

sys.exit(main())
