#!/usr/bin/env python3
"""Start a run with the requester proof: the older spelling of `tp start` (tools/tp.py is the one home).

python tools/start_run.py --state-machine <ARN> --name gpt2-124m-001 --input examples/single-node-ddp.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if not __package__:  # run as a script (`python tools/x.py`): the repository's own modules, from tools/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.tp import app, with_proof

__all__ = ["main", "with_proof"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--state-machine", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--input", required=True)
    args = parser.parse_args(argv)
    region = args.state_machine.split(":")[3]
    app(["start", args.input, "--name", args.name, "--state-machine", args.state_machine, "--region", region])


if __name__ == "__main__":
    main()
