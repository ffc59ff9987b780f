"""Label selectors: `k=v`, `k==v`, `k!=v`, `k` (exists), `!k` (absent), comma-joined (AND)."""
from __future__ import annotations

import re
from dataclasses import dataclass

_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def check_label_key(key: str) -> str:
    """A label key as Kubernetes has them: [DNS-subdomain prefix '/'] name of at most 63 characters."""
    prefix, _, name = key.rpartition("/")
    if not _KEY.match(key) or len(name) > 63 or len(prefix) > 253:
        raise ValueError(f"{key!r} is not a valid label key (an optional DNS subdomain and '/', then at most "
                         "63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)")
    return key


def check_label_value(value: str) -> str:
    if not _VALUE.match(value) or len(value) > 63:
        raise ValueError(f"{value!r} is not a valid label value (at most 63 letters, digits, '-', '_' or '.', "
                         "starting and ending with a letter or digit)")
    return value


class SelectorError(ValueError):
    """A selector that does not parse; the message names the offending part."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "exists", "!"
    value: str = ""

    def matches(self, labels: dict[str, str]) -> bool:
        if self.op == "=":
            return labels.get(self.key) == self.value
        if self.op == "!=":
            return labels.get(self.key) != self.value
        if self.op == "exists":
            return self.key in labels
        return self.key not in labels

    def __str__(self) -> str:
        if self.op == "exists":
            return self.key
        if self.op == "!":
            return f"!{self.key}"
        return f"{self.key}{self.op}{self.value}"


@dataclass(frozen=True)
class Selector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: dict[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)

    def __bool__(self) -> bool:
        return bool(self.requirements)

    @classmethod
    def parse(cls, selector: "str | dict[str, str] | Selector | None") -> "Selector":
        """A selector from text, from a label mapping (all must equal), or as it is."""
        if isinstance(selector, Selector):
            return selector
        if isinstance(selector, dict):
            return cls(tuple(Requirement(k, "=", v) for k, v in selector.items()))
        return parse_selector(selector)


def _check(text: str, key: str, value: str | None) -> None:
    if not _KEY.match(key):
        raise SelectorError(f"selector {text!r}: {key!r} is not a valid label key")
    if value is not None and not _VALUE.match(value):
        raise SelectorError(f"selector {text!r}: {value!r} is not a valid label value")


def parse_selector(text: str | None) -> Selector:
    """Parse a selector; SelectorError names the offending part."""
    if text is None or not text.strip():
        return Selector()
    if re.search(r"\s(in|notin)\s*\(", text):
        raise SelectorError(f"selector {text!r}: set-based requirements (in, notin) are not supported; "
                            "use k=v, k!=v, k or !k")
    reqs = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise SelectorError(f"selector {text!r}: empty requirement")
        m = re.match(r"^([^=!\s]+)\s*(==|=|!=)\s*(.*)$", part)
        if m:
            key, op, value = m.group(1), m.group(2), m.group(3)
            _check(text, key, value)
            reqs.append(Requirement(key, "=" if op == "==" else op, value))
        elif part.startswith("!"):
            key = part[1:].strip()
            _check(text, key, None)
            reqs.append(Requirement(key, "!"))
        else:
            _check(text, part, None)
            reqs.append(Requirement(part, "exists"))
    return Selector(tuple(reqs))
