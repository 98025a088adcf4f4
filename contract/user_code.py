"""A run's own training code (the run input's `code`): how it travels from an engineer's folder to the job's hosts.

`tp` (and `make demo`) pack the folder into one gzipped tar, named by its SHA-256, with the wheels its
requirements need inside (`WHEELHOUSE`, filled for the image's Python and platform: the training subnet reaches
no package index), and upload it write-once. Validate checks it before anything is created; the request carries
its URI and digest. The job receives it as the `CODE_CHANNEL` input channel (the one object, File mode); the
image's launcher checks its digest, unpacks it, installs the wheelhouse with no index, and runs the entry point
under torchrun (or mpirun) with SageMaker's environment, the pre-flight check, hang detection and the failure
file of the built-in trainer.

The platform's description of the code travels as hyperparameters under `CODE_PREFIX`, beside the launcher's
own settings for any job (`hang.*`, `preflight`: contract/config.py names them); the run input's other
hyperparameters are the script's own, which it receives as SageMaker's estimators pass them: `--key value`
arguments after `code.args`, and the SM_HPS / SM_HP_<KEY> environment variables.
"""

from __future__ import annotations

import re

CODE_CHANNEL = "code"
"""The input channel that holds a run's packed code (/opt/ml/input/data/code/<sha256>.tar.gz)."""
ARCHIVE_SUFFIX = ".tar.gz"
DIGEST = re.compile(r"^[0-9a-f]{64}$")
"""A packed code's SHA-256 (hex), which also names its archive: `<digest>.tar.gz`."""
MAX_ARCHIVE_BYTES = 1024**3
"""The largest packed code (its wheelhouse included) a run may name: the image brings torch and the DLC's stack."""

PACKED = ".tp/"
"""What `tp` adds to the packed folder, under this directory of the archive."""
WHEELHOUSE = f"{PACKED}wheelhouse/"
"""The wheels of the code's requirements, for `pip install --no-index --find-links` (hashes checked)."""
PACK_RECORD = f"{PACKED}pack.json"
"""What was packed: the files and their digests, the requirements file, the wheels, the Python and platform."""
IGNORE_FILE = ".tpignore"
"""Patterns (gitignore's syntax) of files in the folder that are not packed; `.gitignore` is honoured too."""

CODE_PREFIX = "code."
"""Hyperparameters under this prefix are the platform's description of the code, never the script's."""
ENTRY_POINT = "code.entry_point"
"""A script in the archive (`train.py`, `src/train.py`) or a module (`-m package.module`)."""
ARGS = "code.args"
"""The script's arguments, a JSON list of strings."""
SHA256 = "code.sha256"
"""The archive's digest, which the launcher checks before unpacking it."""
REQUIREMENTS = "code.requirements"
"""A requirements file in the archive, installed from WHEELHOUSE ("" for none)."""
RETRY_ON_EXIT_CODES = "code.retry_on_exit_codes"
"""A JSON list of the script's exit codes that are platform faults to retry on fresh instances (default none)."""

USER_CODE_FAILED = "UserCodeFailed"
"""The failure file's first word when the script itself exited non-zero: the run ends at once, never retried."""
