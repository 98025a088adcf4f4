"""The platform's CDK stacks (`*_stack.py`), their reusable constructs and the settings model."""

import os
from pathlib import Path

PINNED_NODE = Path(__file__).resolve().parents[1] / "node_modules" / ".bin" / "node"
"""The Node.js release package.json pins (the `node` package), which `make setup` installs."""

# jsii, which aws-cdk-lib starts on its first import, runs on the pinned Node.js rather than the machine's, which
# may be past its end of life (jsii then prints a banner on every start), whoever starts it: cdk, make, python.
if PINNED_NODE.exists():
    os.environ.setdefault("JSII_NODE", str(PINNED_NODE))
