"""Which flags a program's --help documents, and which flags a command line uses.

Only option lines count as documentation: a line that starts (after at most a
little indentation) with a dash, up to its description column. A flag named
in prose ("use --help=all to see more") documents nothing. This reads the
layouts of argparse (vLLM, SGLang), click (ray) and llama.cpp's own
(`-ngl,  --gpu-layers, --n-gpu-layers N   description`).
"""
from __future__ import annotations

import re

MAX_OPTION_INDENT = 8  # option lines are indented 0-4; description continuations 24 and more
_DESCRIPTION_GAP = re.compile(r"(?<![,\s])\s{2,}")  # 2+ spaces, but not the padding after "-ngl,"
_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z0-9][A-Za-z0-9_.\-]*)")
_NEGATABLE = re.compile(r"--\[no-\]([A-Za-z0-9][A-Za-z0-9_.\-]*)")
_NUMBER = re.compile(r"^-\d+(\.\d+)?$")


def documented_flags(help_text: str) -> set[str]:
    """Every spelling of every flag the help's option lines list (long, short, --[no-]x)."""
    return set().union(*option_groups(help_text))


def used_flags(args: list[str]) -> list[str]:
    """The flags in a command's arguments, in order, once each; `--flag=value` counts as `--flag`."""
    seen: dict[str, None] = {}
    for arg in args:
        if len(arg) > 1 and arg.startswith("-") and not _NUMBER.match(arg):
            seen.setdefault(arg.split("=", 1)[0], None)
    return list(seen)


def is_documented(flag: str, documented: set[str]) -> bool:
    """True when the help lists the flag (a dotted `--json-arg.key` counts when `--json-arg` is listed)."""
    if flag in documented:
        return True
    return "." in flag and flag.split(".", 1)[0] in documented


def option_groups(help_text: str) -> list[set[str]]:
    """The spellings of each option line's flag: {'--nnodes', '-n'} from `--nnodes NNODES, -n NNODES`."""
    groups = []
    for line in help_text.splitlines():
        stripped = line.lstrip()
        if not stripped.startswith("-") or len(line) - len(stripped) > MAX_OPTION_INDENT:
            continue
        synopsis = _DESCRIPTION_GAP.split(stripped, maxsplit=1)[0]
        group = set(_FLAG.findall(_NEGATABLE.sub("", synopsis)))
        for name in _NEGATABLE.findall(synopsis):
            group.update((f"--{name}", f"--no-{name}"))
        groups.append(group)
    return groups
