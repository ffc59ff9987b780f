"""What a PromQL expression reads: its series selectors and its grouping labels.

A small reader for the expressions in deploy/grafana/, not a PromQL parser: range
durations and Grafana's variables in them are dropped, `by (...)`/`on (...)` lists are
grouping labels, and every other name not called as a function is a metric, with the
label names of its `{...}` matchers.

    selectors('sum by (model) (rate(x_total{code=~"5.."}[5m]))') == [("x_total", {"code"})]
    grouping('sum by (model) (rate(x_total[5m]))') == {"model"}
"""
from __future__ import annotations

import re

_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_SELECTOR = re.compile(r'([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\})?\s*(\()?')
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"')
_KEYWORDS = {"and", "or", "unless", "bool", "offset"}


def grouping(expr: str) -> set[str]:
    return {label.strip() for group in _GROUPING.findall(_RANGE.sub("", expr))
            for label in group.split(",") if label.strip()}


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    text = _GROUPING.sub("", _RANGE.sub("", expr))
    out = []
    for name, matchers, called in _SELECTOR.findall(text):
        if called or name in _KEYWORDS:
            continue
        out.append((name, set(_MATCHER.findall(matchers))))
    return out
