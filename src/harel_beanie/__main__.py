"""`python -m harel_beanie`: the `harel-beanie` command line (see `harel_beanie.ops.cli`)."""

import sys

from harel_beanie.ops.cli import main

sys.exit(main())
