"""Read the configuration the stacks give each handler through environment variables.

Each handler package declares its variables once, as a `HandlerEnvironment`: the stack builds it
and sets `.variables()` on the function; the handler reads it back with `.from_environ()`.
"""

from __future__ import annotations

import json
import os
import types
import typing
from functools import lru_cache
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, ValidationError


class HandlerEnvironmentError(RuntimeError):
    """The function's environment lacks variables or holds malformed ones (the stack must set them)."""


class HandlerEnvironment(BaseModel):
    """A handler's environment: one variable per field, named as the field in upper case.

    Strings and numbers are written as text, booleans as "true"/"false", lists and dicts as JSON.
    A value may be a CDK token (a plain string at synth).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    def variables(self) -> dict[str, str]:
        """The function's environment variables, in the order of the fields."""
        as_json = self.model_dump(mode="json")
        return {name.upper(): _render(getattr(self, name), as_json[name]) for name in type(self).model_fields}

    @classmethod
    def variable(cls, field: str) -> str:
        """The environment variable of one field, for a stack that sets it apart from the others."""
        if field not in cls.model_fields:
            raise KeyError(f"{cls.__name__} has no field {field!r}; it has {', '.join(cls.model_fields)}")
        return field.upper()

    @classmethod
    def from_environ(cls) -> Self:
        """The environment of this process; parsed once for each set of values it holds."""
        raw = tuple((name, os.environ.get(name.upper())) for name in cls.model_fields)
        parsed = _parsed(cls, raw)
        assert isinstance(parsed, cls)
        return parsed


def _render(value: Any, as_json: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(as_json)


def _is_json(annotation: Any) -> bool:
    """A field written as JSON: a list, tuple, dict or model (through Optional)."""
    if isinstance(annotation, type):
        return issubclass(annotation, list | tuple | dict | BaseModel)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_is_json(arg) for arg in typing.get_args(annotation) if arg is not type(None))
    return origin in (list, tuple, dict)


# Lambda never changes a function's environment; tests and the local platform (localrun/aws/environ.py)
# give one process several, so the parse is cached by the values read.
@lru_cache(maxsize=64)
def _parsed(cls: type[HandlerEnvironment], raw: tuple[tuple[str, str | None], ...]) -> HandlerEnvironment:
    problems: dict[str, str] = {}
    values: dict[str, Any] = {}
    for name, text in raw:
        variable, annotation = name.upper(), cls.model_fields[name].annotation
        if text is None:
            problems[name] = f"{variable} is not set"
        elif annotation is bool and text not in ("true", "false"):
            problems[name] = f"{variable} must be true or false, not {text!r}"
        elif _is_json(annotation):
            try:
                values[name] = json.loads(text)
            except json.JSONDecodeError as exc:
                problems[name] = f"{variable} is not JSON ({exc.msg}): {text!r}"
        else:
            values[name] = text
    try:
        environment = cls.model_validate(values)
    except ValidationError as exc:
        for error in exc.errors():
            name = str(error["loc"][0])
            problems.setdefault(name, f"{name.upper()}: {error['msg']}, not {values.get(name)!r}")
    if problems:
        listed = "; ".join(problems[name] for name in cls.model_fields if name in problems)
        raise HandlerEnvironmentError(f"{cls.__name__}: the stack sets this function's variables; {listed}")
    return environment


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
