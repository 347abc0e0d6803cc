"""`python -m facecast ...` is the `facecast` command."""

import sys

from facecast.cli import main

sys.exit(main())
