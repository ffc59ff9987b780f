"""Parse objects from YAML or dicts, with errors a person can act on."""
from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field, TypeAdapter, ValidationError

from llmgw.api.limits import (
    MAX_BODY_BYTES,
    MAX_MANIFEST_BYTES,
    Duplicates,
    InputError,
    check_document,
    path_text,
    too_deep,
    too_large,
)
from llmgw.api.storage import convert, current_version, removed_problems
from llmgw.api.types import KIND_BY_NAME, AnyObject, Model, Node, Replica, Shard


@functools.cache
def _stored() -> TypeAdapter[Node | Model | Replica | Shard]:
    """Any kind (those of KIND_BY_NAME), told apart by its `kind` field, validated straight from JSON.

    Built on first use: its schema covers every kind (~20 ms), which a CLI command never needs."""
    return TypeAdapter(Annotated[Node | Model | Replica | Shard, Field(discriminator="kind")])


def describe_validation_error(err: ValidationError) -> list[str]:
    """One line per problem: `spec.profiles[0]: unknown field 'gpus_per_node'`."""
    lines = []
    for e in err.errors():
        loc = list(e["loc"])
        # Drop pydantic's internal markers for validators and unions.
        loc = [p for p in loc if not (isinstance(p, str) and ("function-" in p or p.startswith("literal[")
                                                             or p == "[key]"))]
        if e["type"] == "extra_forbidden":
            field = loc.pop() if loc else "?"
            lines.append(f"{path_text(loc) or '<document>'}: unknown field {field!r}")
            continue
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if e["type"] == "missing":
            msg = "required field is missing"
        elif e["type"].endswith("_type"):  # strict: say what came instead ("3", true, 2.0)
            msg += f", got {_json_type(e['input'])} {json.dumps(e['input'], default=str)[:60]}"
        lines.append(f"{path_text(loc) or '<document>'}: {msg}")
    return lines


def _json_type(value: Any) -> str:
    for cls, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
                      (dict, "mapping"), (list, "list")):
        if isinstance(value, cls):
            return name
    return "null" if value is None else type(value).__name__


class InvalidObject(ValueError):
    """A single document that is not a valid object; `problems` holds one line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


def parse_object(doc: Any) -> AnyObject:
    if not isinstance(doc, dict):
        raise InvalidObject([f"<document>: expected a mapping, got {type(doc).__name__}"])
    kind = doc.get("kind")
    if not isinstance(kind, str) or kind not in KIND_BY_NAME:
        raise InvalidObject([f"kind: unknown kind {kind!r} (expected one of {', '.join(KIND_BY_NAME)})"])
    cls, expected = KIND_BY_NAME[kind], current_version(kind)
    if doc.get("apiVersion") != expected:
        raise InvalidObject([f"apiVersion: expected {expected!r}, got {doc.get('apiVersion')!r}"])
    removed = removed_problems(doc)
    if removed:
        raise InvalidObject(removed)
    try:
        return cls.model_validate(doc)
    except ValidationError as err:
        raise InvalidObject(describe_validation_error(err)) from None


def parse_stored(spec_doc: bytes, status_doc: bytes | None) -> AnyObject:
    """An object from its two stored JSON documents (the status one may be missing).

    pydantic parses and validates JSON in one pass, about half the cost of
    json.loads and then validation (watch events are decoded by every
    controller and the server's watch cache). The status document is spliced
    in as the object's `status`, as parse_object would get it; a document that
    does not validate (one stored in an older version among them) is converted to
    its kind's current version (llmgw.api.storage) and goes through parse_object,
    for its messages.
    """
    text = spec_doc if not status_doc else b"%s,\"status\":%s}" % (spec_doc.rstrip()[:-1], status_doc)
    try:
        return _stored().validate_json(text)
    except ValidationError:
        doc = json.loads(spec_doc)
        if status_doc and isinstance(doc, dict):
            doc["status"] = json.loads(status_doc)
        return parse_object(convert(doc) if isinstance(doc, dict) else doc)


class _Loader(yaml.SafeLoader):
    """yaml.safe_load's loader, except that a key repeated in one mapping is kept for
    check_document to report (YAML says keys are unique; PyYAML keeps the last)."""


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> Iterator[dict[Any, Any]]:
    seen: set[Any] = set()
    dup = None
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *base` then overriding a key of base is what merge keys are for
        key = loader.construct_object(key_node, deep=True)
        try:
            if key in seen:
                dup = (key, key_node.start_mark.line + 1)
                break
            seen.add(key)
        except TypeError:
            break  # an unhashable key: construct_mapping says so
    data: dict[Any, Any] = {}
    if dup:
        data = Duplicates()
        data.key, data.line = dup
    yield data
    data.update(loader.construct_mapping(node))


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_map)


def read_yaml(path: Path, max_bytes: int = MAX_MANIFEST_BYTES) -> list[Any]:
    """The documents of a YAML (or JSON) file in UTF-8; InputError("<document>", problem) for a
    file that cannot be read as that. Documents are not yet checked: check_document each."""
    def refuse(problem: str) -> InputError:
        return InputError("<document>", problem)

    try:
        with path.open("rb") as f:
            raw = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise refuse(f"cannot be read: {err.strerror or err}") from None
    if len(raw) > max_bytes:
        raise refuse(f"file is {too_large(max_bytes)}; split it into several files")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise refuse(f"not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}); "
                     "write YAML or JSON in UTF-8") from None
    try:
        return list(yaml.load_all(text, Loader=_Loader))
    except RecursionError:
        raise refuse(too_deep()) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise refuse(f"not valid YAML{where}: {getattr(err, 'problem', None) or err}") from None


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


def load_file(path: str | Path) -> list[AnyObject]:
    """All objects of a multi-document YAML file, or ManifestError naming every bad one."""
    path = Path(path)
    objects, errors = [], []
    index = 0
    try:
        docs = read_yaml(path)
    except InputError as err:
        raise ManifestError([DocumentError(str(path), 0, [str(err)])]) from None
    for doc in docs:
        if doc is None:  # empty document, e.g. a trailing '---'
            continue
        try:
            check_document(doc)
            obj = parse_object(doc)
            _check_size(obj)
            objects.append(obj)
        except InputError as err:
            errors.append(DocumentError(str(path), index, [str(err)]))
        except InvalidObject as err:
            errors.append(DocumentError(str(path), index, err.problems))
        index += 1
    if not objects and not errors:
        errors.append(DocumentError(str(path), 0, ["<document>: no objects in this file (it is empty "
                                                    "or holds only comments)"]))
    if errors:
        raise ManifestError(errors)
    return objects


def _check_size(obj: AnyObject) -> None:
    """InputError for an object the API server would refuse as too large (413): say so before sending."""
    size = len(json.dumps(obj.model_dump(mode="json")).encode())
    if size > MAX_BODY_BYTES:
        raise InputError("<document>", f"{obj.kind} {obj.name!r} is {size} bytes as JSON, "
                                       f"{too_large(MAX_BODY_BYTES)} for one object")


def manifest_files(path: str | Path, recursive: bool = False) -> list[Path]:
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    pattern = "**/*" if recursive else "*"
    return sorted(p for p in path.glob(pattern) if p.is_file() and p.suffix in (".yaml", ".yml", ".json"))


def load_path(path: str | Path, recursive: bool = False) -> list[tuple[Path, AnyObject]]:
    """Objects from a file or directory; a bad document in any file loads nothing at all."""
    loaded: list[tuple[Path, AnyObject]] = []
    errors: list[DocumentError] = []
    for f in manifest_files(path, recursive):
        try:
            loaded.extend((f, obj) for obj in load_file(f))
        except ManifestError as err:
            errors.extend(err.errors)
    if errors:
        raise ManifestError(errors)
    return loaded


def load_manifests(paths: Iterable[str | Path], recursive: bool = False) -> list[tuple[Path, AnyObject]]:
    """Every object of every file or directory, as `llmgw apply -f` and a GitSource read them: a bad
    document anywhere, or one object defined twice, loads nothing (ManifestError names the file,
    the document and the field)."""
    loaded = [item for path in paths for item in load_path(path, recursive=recursive)]
    seen: dict[tuple[str, str], Path] = {}
    index: dict[Path, int] = {}
    errors: list[DocumentError] = []
    for path, obj in loaded:
        n = index[path] = index.get(path, -1) + 1
        key = (obj.kind_plural, obj.name)
        if key in seen:
            errors.append(DocumentError(str(path), n, [f"<document>: {obj.kind} {obj.name!r} is also defined in "
                                                       f"{seen[key]}"]))
        seen.setdefault(key, path)
    if errors:
        raise ManifestError(errors)
    return loaded
