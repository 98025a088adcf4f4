"""Synthesize a git revision (in a temporary worktree) and the working tree, offline, as `make synth` does."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# Files whose difference means the base was synthesized with other versions than it pins.
PINS = ("requirements.txt", "requirements-dev.txt", "constraints.txt", "package.json", "package-lock.json")
# Written into the templates in place of each side's commit (the Register function's PLATFORM_REVISION).
REVISION_PLACEHOLDER = "<git-revision>"
_ERROR_LINES = 25


class ReviewError(Exception):
    """The review cannot run; the message says what to fix."""


@dataclass(frozen=True)
class Revision:
    name: str  # as given: origin/main, HEAD~1, a tag...
    commit: str  # the full commit ID

    @property
    def label(self) -> str:
        return f"{self.name} ({self.commit[:12]})" if self.name != self.commit else self.commit[:12]


def git(root: Path, *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False, timeout=120)
    if result.returncode != 0:
        raise ReviewError(f"git {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout.strip()


def resolve(root: Path, name: str) -> Revision:
    """The commit `name` names in the repository at `root`."""
    result = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", "--end-of-options", f"{name}^{{commit}}"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    if result.returncode != 0 or not result.stdout.strip():
        raise ReviewError(
            f"BASE={name} is not a commit of this repository: name a branch, tag or commit "
            "(fetch it first, e.g. git fetch origin main, or clone with full history in CI)"
        )
    return Revision(name=name, commit=result.stdout.strip())


def default_base(root: Path) -> Revision:
    """origin/main when the clone has it, else main."""
    for name in ("origin/main", "main"):
        try:
            return resolve(root, name)
        except ReviewError:
            continue
    raise ReviewError("neither origin/main nor main exists here: name the revision to review against, BASE=<rev>")


@contextmanager
def worktree(root: Path, revision: Revision, path: Path) -> Iterator[Path]:
    """A detached worktree of `revision` at `path`, removed afterwards."""
    git(root, "worktree", "add", "--detach", "--quiet", str(path), revision.commit)
    try:
        yield path
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(path)], cwd=root, capture_output=True, check=False, timeout=120
        )
        subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True, check=False, timeout=120)


def synth_command(root: Path, outdir: Path) -> list[str]:
    """`cdk synth` of the app in the current directory with this checkout's .venv and CDK CLI, no lookups."""
    cdk = root / "node_modules" / ".bin" / "cdk"
    if not cdk.exists():
        raise ReviewError(f"{cdk} is missing: run make setup")
    app = f"{shlex.quote(sys.executable)} app.py"
    return [str(cdk), "synth", "--quiet", "--no-notices", "--no-lookups", "--app", app, "--output", str(outdir)]


def synth_environment(root: Path) -> dict[str, str]:
    """The environment of the synths and the diff engine: this checkout's pinned Node.js first (as make's)."""
    env = dict(os.environ)
    env.update(
        {
            "PATH": os.pathsep.join([str(root / "node_modules" / ".bin"), env.get("PATH", "")]),
            "CDK_DISABLE_CLI_TELEMETRY": "true",
            # Both sides get the same revision if the app reads it from here; the templates are
            # normalised as well (normalise_revision) for an app that asks git.
            "PLATFORM_REVISION": REVISION_PLACEHOLDER,
        }
    )
    return env


def synth(root: Path, tree: Path, outdir: Path, *, side: str) -> None:
    """Synthesize the app at `tree` into `outdir`; raise with its output if it fails.

    The two sides run one after the other: side by side they took longer on two cores.
    """
    result = subprocess.run(
        synth_command(root, outdir),
        cwd=tree,
        env=synth_environment(root),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
        timeout=600,
    )
    if result.returncode != 0:
        tail = "\n".join(result.stdout.strip().splitlines()[-_ERROR_LINES:])
        fix = "fix it (make synth shows the same)" if tree == root else "review against another BASE"
        raise ReviewError(f"{side} does not synthesize; {fix}:\n{tail}")


def normalise_revision(outdir: Path, commit: str) -> None:
    """Write REVISION_PLACEHOLDER for `commit` (full or abbreviated) in every template of `outdir`."""
    pattern = re.compile(rf"\b{commit[:7]}[0-9a-f]{{0,33}}\b")

    def placeholder(match: re.Match[str]) -> str:
        return REVISION_PLACEHOLDER if commit.startswith(match.group(0)) else match.group(0)

    for path in outdir.glob("*.template.json"):
        text = path.read_text()
        normalised = pattern.sub(placeholder, text)
        if normalised != text:
            path.write_text(normalised)


def differing_pins(base_tree: Path, root: Path) -> list[str]:
    """Pin files that differ between the base revision and the working tree."""
    differ = []
    for name in PINS:
        old, new = base_tree / name, root / name
        old_text = old.read_text() if old.exists() else None
        new_text = new.read_text() if new.exists() else None
        if old_text != new_text:
            differ.append(name)
    return differ
