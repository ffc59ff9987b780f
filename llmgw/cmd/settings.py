"""A command's settings from a pydantic model: a flag per field, and a YAML file of the same names.

``@settings_options(ControllerSettings)`` adds ``--config FILE`` and one flag
per field of the model (``node_grace`` is ``--node-grace``), its --help the
field's description, its default and bounds shown; the command receives
``settings``, the validated model: the model's defaults, then the file's
values, then the flags given. Everything comes from the model, so a new
field is a new flag and a new file key at once. A bad file (not YAML, not a
mapping, an unknown name, a bad value) is one line naming the file and the
key, exit status 2.
"""
from __future__ import annotations

import difflib
import functools
from typing import Any, Callable, TypeVar

import click
import yaml
from click.core import ParameterSource
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")


class SettingsError(click.ClickException):
    """A bad settings file or value: printed as one line, exit status 2 (a usage error, like click's own)."""

    exit_code = 2


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _option(name: str, field: FieldInfo, schema: dict[str, Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The flag of one field; its bounds (from the field's JSON schema) become click's range, so --help shows
    them and click refuses a flag out of bounds as it does any other bad flag."""
    bounds: dict[str, Any] = {}
    for key, arg, open_ in (("minimum", "min", False), ("exclusiveMinimum", "min", True),
                            ("maximum", "max", False), ("exclusiveMaximum", "max", True)):
        if key in schema:
            bounds[arg] = schema[key]
            bounds[f"{arg}_open"] = open_
    if field.annotation is float:
        type_: click.FloatRange | click.IntRange | click.types.StringParamType = click.FloatRange(**bounds)
    elif field.annotation is int:
        type_ = click.IntRange(**bounds)
    elif field.annotation is str:
        type_ = click.STRING
    else:
        raise TypeError(f"setting {name}: no command-line flag for a {field.annotation}")
    return click.option(_flag(name), name, type=type_, metavar=type_.name.split()[0].upper(),
                        default=field.default, show_default=True, help=field.description)


def settings_options(model: type[M]) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Add --config FILE and a flag per field of ``model``; the command receives ``settings`` (a ``model``)."""

    def decorate(command: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(command)
        def wrapper(*args: Any, config: str | None, **kwargs: Any) -> R:
            # a flag not given leaves the file's value (or the model's default) in place
            source = click.get_current_context().get_parameter_source
            flags = {name: kwargs.pop(name) for name in model.model_fields}
            given = {name: value for name, value in flags.items() if source(name) is not ParameterSource.DEFAULT}
            return command(*args, settings=load_settings(model, config, given), **kwargs)

        decorated: Callable[..., R] = wrapper
        schema = model.model_json_schema()["properties"]
        for name, field in reversed(model.model_fields.items()):
            decorated = _option(name, field, schema[name])(decorated)
        return click.option(
            "--config", "config", metavar="FILE", type=click.Path(exists=True, dir_okay=False),
            help="YAML file of settings (the names of the flags below with '_' for '-', e.g. node_grace: 60); "
                 "a flag given overrides the file.")(decorated)

    return decorate


def load_settings(model: type[M], path: str | None, flags: dict[str, Any]) -> M:
    """The model from its defaults, then the file at ``path`` (if any), then ``flags``; SettingsError if bad."""
    values = read_file(path) if path is not None else {}
    _validate(model, values, path, {})     # the file alone: a mistake in it is refused even where a flag overrides
    return _validate(model, {**values, **flags}, path, flags)


def _validate(model: type[M], values: dict[str, Any], path: str | None, flags: dict[str, Any]) -> M:
    try:
        return model.model_validate(values)
    except ValidationError as err:
        raise SettingsError("; ".join(_describe(e, model, path, flags) for e in err.errors())) from None


def read_file(path: str, expected: str = "a mapping of setting names to values, e.g. node_grace: 60") -> dict[str, Any]:
    """The file's mapping of names to values; SettingsError (naming the file, and what was
    `expected`) if it holds anything else."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except OSError as err:
        raise SettingsError(f"{path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise SettingsError(f"{path}: not YAML: {getattr(err, 'problem', None) or err}{line}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict) or not all(isinstance(k, str) for k in doc):
        raise SettingsError(f"{path}: expected {expected}")
    return doc


def _describe(error: ErrorDetails, model: type[BaseModel], path: str | None, flags: dict[str, Any]) -> str:
    name = str(error["loc"][0]) if error["loc"] else ""
    if error["type"] == "extra_forbidden":
        close = difflib.get_close_matches(name, model.model_fields, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return f"{path}: unknown setting {name!r}{hint}"
    where = _flag(name) if name in flags else f"{path}: {name}"
    return f"{where}: {error['msg']} (got {error['input']!r})"
