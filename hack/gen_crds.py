#!/usr/bin/env python3
"""Write crds/<kind>.schema.json from llmgw.api's pydantic types.

    python hack/gen_crds.py          # rewrite crds/
    python hack/gen_crds.py --check  # exit 1 if crds/ is stale (the tests run this)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmgw.api import KINDS  # noqa: E402


def schemas() -> dict[str, str]:
    out = {}
    for cls in KINDS.values():
        kind = cls.model_fields["kind"].default
        schema = cls.model_json_schema(mode="validation")
        schema = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"https://llmgw.io/schemas/v1/{kind.lower()}.schema.json",
            "title": f"llmgw.io/v1 {kind}",
            **schema,
        }
        out[f"{kind.lower()}.schema.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return out


def main() -> int:
    check = "--check" in sys.argv[1:]
    crds = ROOT / "crds"
    stale = []
    for name, text in schemas().items():
        path = crds / name
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            crds.mkdir(exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run: python hack/gen_crds.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
