"""`python -m voicepipe`: the same as the `voicepipe` command."""

import sys

from voicepipe.cli import main

sys.exit(main())
