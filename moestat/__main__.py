"""``python -m moestat`` runs the command line (:mod:`moestat.cli`)."""

import sys

from .cli import main

sys.exit(main())
