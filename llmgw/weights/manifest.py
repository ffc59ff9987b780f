"""The manifest of a model directory on an HTTP origin: `DIR/manifest.json`.

    {"files": [{"path": "config.json", "size": 571, "sha256": "<64 hex>"}, ...]}

Every file of the model, its size and sha256; paths relative to DIR, '/'-separated. `write`
makes one for a directory (what an operator publishing weights, and the tests' origin, run).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from llmgw.weights.digest import check_path
from llmgw.weights.errors import PullError

MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 16 << 20      # a listing of files: a few thousand lines at most


class ManifestFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    path: Annotated[str, AfterValidator(check_path)]
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    files: list[ManifestFile] = Field(min_length=1)


def parse(raw: bytes, where: str) -> Manifest:
    try:
        manifest = Manifest.model_validate_json(raw)
    except ValidationError as err:
        first = err.errors()[0]
        path = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise PullError("BadManifest", f"{where}: {path}: {first['msg']}") from None
    names = [f.path for f in manifest.files]
    if len(set(names)) != len(names):
        raise PullError("BadManifest", f"{where}: a path is listed twice")
    return manifest


def write(directory: Path) -> Manifest:
    """List every file under `directory` (but the manifest) into its manifest.json."""
    files = []
    for p in sorted(q for q in directory.rglob("*") if q.is_file() and q.name != MANIFEST):
        h = hashlib.sha256()
        with p.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        files.append(ManifestFile(path=p.relative_to(directory).as_posix(), size=p.stat().st_size,
                                  sha256=h.hexdigest()))
    manifest = Manifest(files=files)
    (directory / MANIFEST).write_text(json.dumps(manifest.model_dump(), indent=1))
    return manifest
