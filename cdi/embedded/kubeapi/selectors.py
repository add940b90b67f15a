"""Label and field selectors, in the string syntax of list/watch query parameters and the
`LabelSelector` object syntax used inside specs (PV selectors, service selectors)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cdi.embedded.kubeapi.errors import bad_request

Labels = Mapping[str, str]


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: Labels) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op == "=":
            return present and labels[self.key] == self.values[0]
        if self.op == "!=":
            return not present or labels[self.key] != self.values[0]
        if self.op == "in":
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values  # notin


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.requirements

    def matches(self, labels: Labels | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)


_SET_EXPR = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")
_EQ_EXPR = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)\s*$")


def _split_top_level(text: str) -> list[str]:
    """Commas separate requirements, except inside the parentheses of `in (a,b)`."""
    parts, depth, current = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p for p in (s.strip() for s in parts) if p]


def parse_label_selector(text: str | None) -> LabelSelector:
    if not text:
        return LabelSelector()
    requirements = []
    for part in _split_top_level(text):
        eq = _EQ_EXPR.match(part)
        if eq:
            key, op, value = eq.groups()
            requirements.append(Requirement(key, "!=" if op == "!=" else "=", (value,)))
            continue
        st = _SET_EXPR.match(part)
        if not st:
            raise bad_request(f"unable to parse requirement: found '{part}', expected: identifier")
        bang, key, op, values = st.groups()
        if op:
            if bang:
                raise bad_request(f"unable to parse requirement: {part}")
            vals = tuple(v.strip() for v in values.split(",") if v.strip())
            requirements.append(Requirement(key, op, vals))
        else:
            requirements.append(Requirement(key, "!" if bang else "exists"))
    return LabelSelector(tuple(requirements))


def label_selector_from_object(selector: Mapping[str, Any] | None) -> LabelSelector:
    """A `metav1.LabelSelector` (matchLabels + matchExpressions). An empty one matches everything."""
    if not selector:
        return LabelSelector()
    requirements = [Requirement(k, "=", (str(v),)) for k, v in (selector.get("matchLabels") or {}).items()]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for expr in selector.get("matchExpressions") or []:
        op = ops.get(expr.get("operator", ""))
        if op is None:
            raise bad_request(f"{expr.get('operator')!r} is not a valid label selector operator")
        requirements.append(Requirement(expr["key"], op, tuple(expr.get("values") or ())))
    return LabelSelector(tuple(requirements))


@dataclass(frozen=True)
class FieldRequirement:
    path: tuple[str, ...]
    negate: bool
    value: str
    default: str = ""  # what the field reads as when the object leaves it out


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.requirements

    def only_name(self) -> str | None:
        """The name when the selector is exactly `metadata.name=<x>` (kubectl wait, delete --wait)."""
        if len(self.requirements) == 1:
            req = self.requirements[0]
            if req.path == ("metadata", "name") and not req.negate:
                return req.value
        return None

    def matches(self, obj: Mapping[str, Any]) -> bool:
        for req in self.requirements:
            actual = _field_value(obj, req.path, req.default)
            if (actual == req.value) == req.negate:
                return False
        return True


def _field_value(obj: Mapping[str, Any], path: tuple[str, ...], default: str = "") -> str:
    node: Any = obj
    for step in path:
        if not isinstance(node, Mapping):
            return default
        node = node.get(step)
    if node is None:
        return default
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


_FIELD = re.compile(r"^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*$")


def parse_field_selector(text: str | None) -> FieldSelector:
    if not text:
        return FieldSelector()
    requirements = []
    for part in text.split(","):
        if not part.strip():
            continue
        match = _FIELD.match(part)
        if not match:
            raise bad_request(f'invalid field selector: "{part}"')
        field, op, value = match.groups()
        requirements.append(FieldRequirement(tuple(field.split(".")), op == "!=", value))
    return FieldSelector(tuple(requirements))


Predicate = Callable[[Mapping[str, Any]], bool]
