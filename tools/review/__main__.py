"""`make review BASE=<rev>`: synthesize BASE and the working tree offline, compare them, write review.md.

    python -m tools.review [--base REV] [--output review.md] [--allow-stateful]

Exit status: 0 reviewed; 1 a stateful resource would be replaced or removed (ALLOW_STATEFUL=1 or
--allow-stateful accepts it); 2 the review could not run (the message says what to fix).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.review import render, report, synth
from tools.review.assembly import read_assembly
from tools.review.synth import ReviewError

ENGINE = Path(__file__).with_name("diff.mjs")


def run_review(root: Path, base: synth.Revision, workdir: Path) -> report.Review:
    """Synthesize `base` and the working tree at `root` into `workdir` and compare them."""
    base_tree, base_out, head_out = workdir / "base", workdir / "base.out", workdir / "head.out"
    with synth.worktree(root, base, base_tree):
        synth.synth(root, base_tree, base_out, side=f"the base revision {base.label}")
        pins = synth.differing_pins(base_tree, root)
    synth.synth(root, root, head_out, side="the working tree")
    synth.normalise_revision(base_out, base.commit)
    synth.normalise_revision(head_out, synth.git(root, "rev-parse", "HEAD"))
    engine = subprocess.run(
        ["node", str(ENGINE), str(base_out), str(head_out)],
        cwd=root,
        env=synth.synth_environment(root),
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if engine.returncode != 0:
        raise ReviewError(f"the diff engine failed (is node_modules current? run make setup):\n{engine.stderr.strip()}")
    review = report.build(json.loads(engine.stdout), read_assembly(base_out), read_assembly(head_out), base.label)
    if pins:
        review.notes.append(
            f"{', '.join(pins)} differ between {base.label} and the working tree; both sides were synthesized with "
            "the working tree's .venv and node_modules, so changes that come only from other dependency versions "
            "are not shown."
        )
    return review


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.review", description=__doc__.split("\n")[0])
    parser.add_argument("--base", help="git revision to compare with (default: origin/main, else main)")
    parser.add_argument("--output", default="review.md", type=Path, help="where to write the report")
    parser.add_argument(
        "--allow-stateful",
        action="store_true",
        default=os.environ.get("ALLOW_STATEFUL") == "1",
        help="exit 0 even when a stateful resource is replaced or removed (also ALLOW_STATEFUL=1)",
    )
    args = parser.parse_args(argv)
    args.output.unlink(missing_ok=True)  # a review that cannot run leaves no stale report behind
    try:
        root = Path(synth.git(Path.cwd(), "rev-parse", "--show-toplevel"))
        base = synth.resolve(root, args.base) if args.base else synth.default_base(root)
        with tempfile.TemporaryDirectory(prefix="review-") as workdir:
            review = run_review(root, base, Path(workdir))
    except ReviewError as exc:
        print(f"make review: {exc}", file=sys.stderr)
        return 2
    except (OSError, subprocess.SubprocessError) as exc:  # git, node or the CDK CLI missing or hung
        print(f"make review: {exc}; check that git and node are installed and run make setup", file=sys.stderr)
        return 2
    args.output.write_text(render.render(review, allow_stateful=args.allow_stateful))
    print(render.summary(review, allow_stateful=args.allow_stateful))
    if not review.empty:
        print(f"\nThe full review is in {args.output}.")
    return report.exit_code(review, allow_stateful=args.allow_stateful)


if __name__ == "__main__":
    sys.exit(main())
