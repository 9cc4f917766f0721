"""``python -m streampass``: the command line."""

import sys

from streampass.cli import main

sys.exit(main())
