"""``python -m action``: run the GitHub Action's steps (inputs from ``INPUT_*``)."""

import sys

from .main import main

sys.exit(main())
