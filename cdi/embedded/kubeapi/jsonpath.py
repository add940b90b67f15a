"""The subset of Kubernetes JSONPath that printer columns use: `.a.b`, `.a[0]`, `.a[*].b` and
filters such as `.status.conditions[?(@.type=="Ready")].status`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_TOKEN = re.compile(
    r"""\.([A-Za-z0-9_\-/]+)"""  # .field
    r"""|\[(\*|-?\d+)\]"""  # [3] or [*]
    r"""|\[\?\(@\.([A-Za-z0-9_.]+)\s*(==|!=)\s*["']?([^"'\]]*)["']?\)\]"""  # [?(@.type=="Ready")]
)


def compile_path(expr: str) -> list[tuple[str, Any]]:
    text = expr.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    if text.startswith("$"):
        text = text[1:]
    steps: list[tuple[str, Any]] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match:
            raise ValueError(f"unsupported JSONPath {expr!r} at {text[pos:]!r}")
        name, index, filter_field, filter_op, filter_value = match.groups()
        if name is not None:
            steps.append(("key", name))
        elif index is not None:
            steps.append(("all", None) if index == "*" else ("index", int(index)))
        else:
            steps.append(("filter", (filter_field.split("."), filter_op, filter_value)))
        pos = match.end()
    return steps


def find(obj: Any, steps: list[tuple[str, Any]]) -> list[Any]:
    nodes = [obj]
    for kind, arg in steps:
        nxt: list[Any] = []
        for node in nodes:
            if kind == "key":
                if isinstance(node, Mapping) and arg in node:
                    nxt.append(node[arg])
                elif isinstance(node, list):  # implicit fan-out, as kubectl's jsonpath does
                    nxt.extend(item[arg] for item in node if isinstance(item, Mapping) and arg in item)
            elif kind == "index":
                if isinstance(node, list) and -len(node) <= arg < len(node):
                    nxt.append(node[arg])
            elif kind == "all":
                if isinstance(node, list):
                    nxt.extend(node)
                elif isinstance(node, Mapping):
                    nxt.extend(node.values())
            else:
                path, op, value = arg
                for item in node if isinstance(node, list) else []:
                    actual: Any = item
                    for step in path:
                        actual = actual.get(step) if isinstance(actual, Mapping) else None
                    if (str(actual) == value if actual is not None else False) == (op == "=="):
                        nxt.append(item)
        nodes = nxt
    return nodes


def first(obj: Any, expr: str) -> Any:
    found = find(obj, compile_path(expr))
    return found[0] if found else None
