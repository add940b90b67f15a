"""Request bodies decoded into plain data (JSON, YAML or Kubernetes protobuf), refusing with 400, as
kube-apiserver does, what cannot be decoded or nests deeper than the server can handle.

The bound on nesting is what keeps a hostile body from reaching recursive code: PyYAML's composer
recurses once per level (10^5 nested flow sequences overflow the interpreter's stack), and the
encoder that stores and serves objects stops at 254 levels. kube-apiserver bounds JSON and YAML at
10000 levels for the same reason (its Go decoders); here the bound is lower, far above what any real
object needs (a CRD's OpenAPI schema, the deepest of them, stays well under a hundred levels)."""

from __future__ import annotations

from typing import Any

import orjson
import yaml

from cdi.embedded.kubeapi import errors, protobuf

MAX_DEPTH = 200
"""Most levels of nested objects and arrays a body may have (the outermost object is level 1)."""

MAX_BYTES = 3 * 1024 * 1024
"""The largest request body, as kube-apiserver's --max-request-bytes default (3 MiB)."""


def _json_key(key: Any) -> str:
    """A YAML mapping key as a JSON object key, as sigs.k8s.io/yaml converts them (`1: a` is "1")."""
    if isinstance(key, bool):
        return "true" if key else "false"
    if key is None:
        return "null"
    return str(key)


def _excess(value: Any, max_depth: int, budget: int | None) -> str | None:
    """Why `value` cannot be taken: nested more than `max_depth` levels, or (with a budget, for YAML,
    whose aliases can repeat one subtree many times) larger once expanded than any body could be.
    Walked without recursion; YAML mapping keys become strings on the way."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    size = 0
    while stack:
        node, depth = stack.pop()
        size += 1
        if isinstance(node, str):
            size += len(node)
        elif isinstance(node, (dict, list)):
            if depth > max_depth:
                return f"exceeded max depth of {max_depth}"
            if isinstance(node, dict):
                if budget is not None and not all(isinstance(k, str) for k in node):
                    items = list(node.items())
                    node.clear()
                    node.update((_json_key(k), v) for k, v in items)
                size += sum(len(k) for k in node)
                stack.extend((child, depth + 1) for child in node.values())
            else:
                stack.extend((child, depth + 1) for child in node)
        if budget is not None and size > budget:
            return "document contains excessive aliasing"
    return None


def too_deep(value: Any) -> bool:
    """Whether `value` nests objects and arrays more than MAX_DEPTH levels deep."""
    return _excess(value, MAX_DEPTH, None) is not None


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose composer refuses a collection nested deeper than MAX_DEPTH before recursing
    into it (the composer is the one recursive stage; scanner, parser and constructor are not)."""

    def __init__(self, stream: bytes) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if not self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise yaml.composer.ComposerError(None, None, f"exceeded max depth of {MAX_DEPTH}", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _undecodable(reason: object) -> errors.StatusError:
    return errors.bad_request(f"the body of the request could not be decoded: {reason}")


def _yaml_reason(exc: yaml.YAMLError) -> str:
    """A YAML error in the words kube-apiserver uses (sigs.k8s.io/yaml over go-yaml): one line, no excerpt."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}: " if mark is not None else ""
        return f"error converting YAML to JSON: yaml: {where}{exc.problem}"
    return f"error converting YAML to JSON: yaml: {exc}"


def decode(data: bytes, content_type: str) -> Any:
    """The body as plain data; None for an empty body."""
    if not data:
        return None
    if "protobuf" in content_type:
        return protobuf.decode(data)
    is_yaml = "yaml" in content_type
    try:
        value = yaml.load(data, Loader=_BoundedLoader) if is_yaml else orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        # orjson gives up past 1024 levels; say it as for any body past the bound
        raise _undecodable(f"exceeded max depth of {MAX_DEPTH}" if "depth limit" in str(exc) else exc) from exc
    except yaml.YAMLError as exc:
        raise _undecodable(_yaml_reason(exc)) from exc
    excess = _excess(value, MAX_DEPTH, MAX_BYTES if is_yaml else None)
    if excess:
        raise _undecodable(f"error converting YAML to JSON: yaml: {excess}" if is_yaml else excess)
    return value
