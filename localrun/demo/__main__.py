"""`python -m localrun.demo`: see localrun/demo/cli.py."""

import sys

from localrun.demo.cli import main

sys.exit(main())
