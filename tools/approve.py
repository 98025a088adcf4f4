#!/usr/bin/env python3
"""Decide approval requests: the older spelling of `tp pending|approve|reject` (tools/tp.py is the one home).

python tools/approve.py --url <decision URL> list [--limit 20] [--cursor <next>]
python tools/approve.py --url <decision URL> approve|reject <request id> --reason "..."
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a script (`python tools/x.py`): the repository's own modules, from tools/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.tp import app, signed_request

__all__ = ["main", "signed_request"]


def main(argv: list[str] | None = None) -> None:
    """`--url U list ...` is `tp pending ... --decision-url U`; `--url U approve ID ...` is `tp approve ID ...`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[0] != "--url":
        raise SystemExit(__doc__)
    url, command, rest = args[1], args[2], args[3:]
    app([{"list": "pending"}.get(command, command), *rest, "--decision-url", url])


if __name__ == "__main__":
    main()
