"""Read the configuration the stacks give each handler through environment variables."""

from __future__ import annotations

import json
import os
from typing import Any


def env_str(name: str) -> str:
    try:
        return os.environ[name]
    except KeyError:
        raise RuntimeError(f"environment variable {name} is not set; the stack must define it") from None


def env_json(name: str) -> Any:
    return json.loads(env_str(name))


def env_float(name: str) -> float:
    return float(env_str(name))


def env_int(name: str) -> int:
    return int(env_str(name))


def env_bool(name: str) -> bool:
    value = env_str(name)
    if value not in ("true", "false"):
        raise RuntimeError(f"environment variable {name} must be true or false, not {value!r}")
    return value == "true"
