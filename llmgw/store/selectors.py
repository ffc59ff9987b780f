"""Label selectors, as in Kubernetes: `app=x,tier!=cache,gpu,!spot`."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Selector:
    equal: dict[str, str] = field(default_factory=dict)
    not_equal: dict[str, str] = field(default_factory=dict)
    exists: frozenset[str] = frozenset()
    absent: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, text: "str | dict | Selector | None") -> "Selector":
        if text is None or isinstance(text, Selector):
            return text or cls()
        if isinstance(text, dict):
            return cls(equal=dict(text))
        equal, not_equal, exists, absent = {}, {}, set(), set()
        for term in (t.strip() for t in text.split(",")):
            if not term:
                continue
            if "!=" in term:
                k, v = term.split("!=", 1)
                not_equal[k.strip()] = v.strip()
            elif "=" in term:
                k, v = term.split("==", 1) if "==" in term else term.split("=", 1)
                equal[k.strip()] = v.strip()
            elif term.startswith("!"):
                absent.add(term[1:].strip())
            else:
                exists.add(term)
        for k in [*equal, *not_equal, *exists, *absent]:
            if not k:
                raise ValueError(f"bad label selector {text!r}: empty key")
        return cls(equal, not_equal, frozenset(exists), frozenset(absent))

    def matches(self, labels: dict[str, str]) -> bool:
        return (all(labels.get(k) == v for k, v in self.equal.items())
                and all(labels.get(k) != v for k, v in self.not_equal.items())
                and all(k in labels for k in self.exists)
                and all(k not in labels for k in self.absent))

    def __str__(self) -> str:
        terms = [f"{k}={v}" for k, v in self.equal.items()] + [f"{k}!={v}" for k, v in self.not_equal.items()]
        return ",".join(terms + sorted(self.exists) + [f"!{k}" for k in sorted(self.absent)])
