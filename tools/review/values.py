"""Template values written briefly for a review: short ones in full, long ones as the fields that changed."""

from __future__ import annotations

import json
from typing import Any

# Values longer than this are named as changed rather than printed.
SHORT = 80


def short(value: Any) -> str | None:
    """`value` as text when it is short enough to print, else None."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= SHORT else None


def differences(old: Any, new: Any, path: str = "", depth: int = 2) -> list[str]:
    """`field: old → new` for short values, `field changed` (or added/removed) for long ones, `depth` levels deep."""
    if isinstance(old, dict) and isinstance(new, dict) and depth > 0:
        lines = []
        for key in [*old, *(k for k in new if k not in old)]:
            field = f"{path}.{key}" if path else str(key)
            if key not in new:
                lines.append(f"{field} removed")
            elif key not in old:
                shown = short(new[key])
                lines.append(f"{field} added" + (f": {shown}" if shown is not None else ""))
            elif old[key] != new[key]:
                lines.extend(differences(old[key], new[key], field, depth - 1))
        return lines
    before, after = short(old), short(new)
    if before is not None and after is not None:
        return [f"{path}: {before} → {after}" if path else f"{before} → {after}"]
    return [f"{path} changed" if path else "changed"]
