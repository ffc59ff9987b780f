"""Parse objects from YAML or dicts, with errors a person can act on."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Iterable, Union

import yaml
from pydantic import Field, TypeAdapter, ValidationError

from llmgw.api.types import KIND_BY_NAME, Object

# Any kind, told apart by its `kind` field, validated straight from JSON.
_STORED = TypeAdapter(Annotated[Union[tuple(KIND_BY_NAME.values())], Field(discriminator="kind")])


def _path(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def describe_validation_error(err: ValidationError) -> list[str]:
    """One line per problem: `spec.profiles[0]: unknown field 'gpus_per_node'`."""
    lines = []
    for e in err.errors():
        loc = list(e["loc"])
        # Drop pydantic's internal markers for validators and unions.
        loc = [p for p in loc if not (isinstance(p, str) and ("function-" in p or p.startswith("literal[")))]
        if e["type"] == "extra_forbidden":
            field = loc.pop() if loc else "?"
            lines.append(f"{_path(loc) or '<document>'}: unknown field {field!r}")
            continue
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if e["type"] == "missing":
            msg = "required field is missing"
        lines.append(f"{_path(loc) or '<document>'}: {msg}")
    return lines


class InvalidObject(ValueError):
    """A single document that is not a valid object; `problems` holds one line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


def parse_object(doc: Any) -> Object:
    if not isinstance(doc, dict):
        raise InvalidObject([f"<document>: expected a mapping, got {type(doc).__name__}"])
    kind = doc.get("kind")
    cls = KIND_BY_NAME.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise InvalidObject([f"kind: unknown kind {kind!r} (expected one of {', '.join(KIND_BY_NAME)})"])
    if doc.get("apiVersion") != "llmgw.io/v1":
        raise InvalidObject([f"apiVersion: expected 'llmgw.io/v1', got {doc.get('apiVersion')!r}"])
    try:
        return cls.model_validate(doc)
    except ValidationError as err:
        raise InvalidObject(describe_validation_error(err)) from None


def parse_stored(spec_doc: bytes, status_doc: bytes | None) -> Object:
    """An object from its two stored JSON documents (the status one may be missing).

    pydantic parses and validates JSON in one pass, about half the cost of
    json.loads and then validation (watch events are decoded by every
    controller and the server's watch cache). The status document is spliced
    in as the object's `status`, as parse_object would get it; a document that
    does not validate goes through parse_object, for its messages.
    """
    text = spec_doc if not status_doc else b"%s,\"status\":%s}" % (spec_doc.rstrip()[:-1], status_doc)
    try:
        return _STORED.validate_json(text)
    except ValidationError:
        doc = json.loads(spec_doc)
        if status_doc and isinstance(doc, dict):
            doc["status"] = json.loads(status_doc)
        return parse_object(doc)


@dataclass
class DocumentError:
    file: str
    index: int  # 0-based position of the document in its file
    problems: list[str]

    def __str__(self) -> str:
        return "\n".join(f"{self.file}: document {self.index}: {p}" for p in self.problems)


class ManifestError(ValueError):
    """Every bad document of one or more files; nothing from those files was loaded."""

    def __init__(self, errors: list[DocumentError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


def load_file(path: str | Path) -> list[Object]:
    """All objects of a multi-document YAML file, or ManifestError naming every bad one."""
    path = Path(path)
    try:
        docs = list(yaml.safe_load_all(path.read_text()))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ManifestError([DocumentError(str(path), 0, [f"<document>: not valid YAML{where}: {getattr(err, 'problem', err)}"])]) from None
    objects, errors = [], []
    index = 0
    for doc in docs:
        if doc is None:  # empty document, e.g. a trailing '---'
            continue
        try:
            objects.append(parse_object(doc))
        except InvalidObject as err:
            errors.append(DocumentError(str(path), index, err.problems))
        index += 1
    if errors:
        raise ManifestError(errors)
    return objects


def manifest_files(path: str | Path, recursive: bool = False) -> list[Path]:
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    pattern = "**/*" if recursive else "*"
    return sorted(p for p in path.glob(pattern) if p.is_file() and p.suffix in (".yaml", ".yml", ".json"))


def load_path(path: str | Path, recursive: bool = False) -> list[tuple[Path, Object]]:
    """Objects from a file or directory; a bad document in any file loads nothing at all."""
    loaded, errors = [], []
    for f in manifest_files(path, recursive):
        try:
            loaded.extend((f, obj) for obj in load_file(f))
        except ManifestError as err:
            errors.extend(err.errors)
    if errors:
        raise ManifestError(errors)
    return loaded
