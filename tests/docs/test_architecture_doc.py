"""docs/architecture.md's package map names every package and module of the code.

The map is the code block under "## Packages": a package is a line that starts
with its path and a slash (`  agent/`, `  agent/discovery/`, `controllers/`), and
the lines below it, up to the next package, describe it; each of its modules
must be named there by file name (`runner.py`). A module added without a line
in the map, or a line left behind by a module that is gone, fails here.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
HEADER = re.compile(r"^( {0,2})((?:[a-z_]+/)+)")         # "llmgw/", "  agent/", "  agent/discovery/"
TOP_MODULE = re.compile(r"^  ([a-z_][a-z0-9_]*\.py)\b")   # "  reflector.py": a module of llmgw itself
MODULE = re.compile(r"(?<![/\w.])([a-z_][a-z0-9_]*\.py)\b")  # "api/kinds.py" names another package's module


def package_map() -> dict[str, str]:
    """Package path (relative to the repository, e.g. 'llmgw/agent/discovery') -> its text in the map."""
    text = DOC.read_text()
    block = text.split("## Packages", 1)[1].split("```", 2)[1]
    sections: dict[str, list[str]] = {}
    current: str | None = None
    for line in block.splitlines():
        if m := HEADER.match(line):
            path = m.group(2).rstrip("/")
            current = path if not m.group(1) else f"llmgw/{path}"   # column 0: the repository's folders
            sections.setdefault(current, [])
            line = line[m.end():]
        elif TOP_MODULE.match(line):
            current = "llmgw"
        if current is not None:
            sections[current].append(line)
    return {path: "\n".join(lines) for path, lines in sections.items()}


def code_packages() -> dict[str, set[str]]:
    """Package path -> the file names of its modules (not __init__.py)."""
    out: dict[str, set[str]] = {}
    for top in ("llmgw", "controllers"):
        for init in sorted((ROOT / top).rglob("__init__.py")):
            pkg = init.parent
            out[str(pkg.relative_to(ROOT))] = {p.name for p in pkg.glob("*.py") if p.name != "__init__.py"}
    return out


def test_every_package_and_module_is_in_the_map() -> None:
    doc = package_map()
    missing = [f"{pkg}/" for pkg in code_packages() if pkg not in doc]
    missing += [f"{pkg}/{mod}" for pkg, mods in code_packages().items() if pkg in doc
                for mod in sorted(mods) if not re.search(rf"\b{re.escape(mod)}\b", doc[pkg])]
    assert not missing, f"docs/architecture.md's package map does not name: {', '.join(missing)}"


def test_the_map_names_nothing_that_is_gone() -> None:
    code = code_packages()
    python = [pkg for pkg in package_map() if pkg.split("/")[0] in ("llmgw", "controllers")]
    stale = [f"{pkg}/" for pkg in python if pkg not in code]
    stale += [f"{pkg}/{mod}" for pkg, text in package_map().items() if pkg in code
              for mod in sorted(set(MODULE.findall(text))) if mod not in code[pkg]]
    assert not stale, f"docs/architecture.md's package map names what the code no longer has: {', '.join(stale)}"
