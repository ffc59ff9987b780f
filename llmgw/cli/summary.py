"""A command's one-line summary for `llmgw --help` and the completion of command names, read from
its module's source rather than by importing it: importing every command (the server, the agent,
the gateway, the controllers) took `llmgw --help` ~0.6 s.

The summary is click's own (the first sentence of the docstring, cut to fit the width); a
command whose docstring is not there to read (made by a factory, or given help=) is None, and
its caller imports it instead. tests/cli/test_cli_startup.py holds every summary to click's.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import inspect

import click


def summary(target: str, limit: int) -> str | None:
    """The short help of the command at "module:attribute", or None when it cannot be read."""
    module, attr = target.split(":")
    doc = _docstrings(module).get(attr)
    # the help click would make of that docstring, cut as click cuts it
    return None if doc is None else click.Command(None, help=doc).get_short_help_str(limit)


@functools.cache
def _docstrings(module: str) -> dict[str, str]:
    """The docstrings of a module's functions decorated as click commands without help=."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return {}
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(_is_plain_command(d) for d in node.decorator_list):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found[node.name] = inspect.cleandoc(doc)
    return found


def _is_plain_command(decorator: ast.expr) -> bool:
    """@click.command(...) or @click.group(...) (or @group.command(...)) without help= or short_help=."""
    if not isinstance(decorator, ast.Call) or not isinstance(decorator.func, ast.Attribute):
        return False
    if decorator.func.attr not in ("command", "group"):
        return False
    return not any(k.arg in ("help", "short_help") for k in decorator.keywords)
