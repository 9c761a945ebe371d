"""``python -m lightning_resume``: the ``lightning-resume`` command line."""

import sys

from lightning_resume.cli import main

if __name__ == "__main__":
    sys.exit(main())
