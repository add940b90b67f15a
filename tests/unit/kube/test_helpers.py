"""Pure helpers of cdi.kube: error mapping, paths and keys, patches, backoff."""

from __future__ import annotations

import random

import jsonpatch
import pytest

from cdi.api.groups import CONFIGMAPS, DATAVOLUMES, NAMESPACES, STORAGEPROFILES
from cdi.kube import (
    AlreadyExists,
    ApiError,
    Backoff,
    Conflict,
    Gone,
    Invalid,
    ServerError,
    TooManyRequests,
    make_key,
    object_key,
    resource_path,
    split_key,
)
from cdi.kube.errors import error_from_response, error_from_status
from cdi.kube.patches import add_finalizer_patch, merge_diff, remove_finalizer_patch, with_resource_version


def status(code: int, reason: str, **details: object) -> dict[str, object]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": f"m{code}", "reason": reason,
            "code": code, "details": details}


def test_errors_by_code_and_reason() -> None:
    assert type(error_from_status(status(409, "AlreadyExists"))) is AlreadyExists
    assert type(error_from_status(status(409, "Conflict"))) is Conflict
    assert type(error_from_status(status(410, "Expired"))) is Gone
    assert type(error_from_status(status(503, "ServiceUnavailable"))) is ServerError
    assert type(error_from_status(status(418, "Teapot"))) is ApiError
    invalid = error_from_status(status(422, "Invalid", causes=[{"field": "spec.x", "message": "bad",
                                                                 "reason": "FieldValueInvalid"}]))
    assert isinstance(invalid, Invalid) and invalid.causes[0].field == "spec.x"
    throttled = error_from_response(429, b'{"kind":"Status","code":429,"reason":"TooManyRequests"}', "3")
    assert isinstance(throttled, TooManyRequests) and throttled.retry_after == 3.0 and throttled.transient
    proxy = error_from_response(502, b"<html>Bad Gateway</html>")
    assert isinstance(proxy, ServerError) and proxy.code == 502 and "Bad Gateway" in proxy.message
    assert str(error_from_status(status(404, "NotFound"))) == "404 NotFound: m404"


def test_paths_and_keys() -> None:
    assert resource_path(CONFIGMAPS) == "/api/v1/configmaps"
    assert resource_path(CONFIGMAPS, "ns") == "/api/v1/namespaces/ns/configmaps"
    assert resource_path(DATAVOLUMES, "ns", "dv", "status") == \
        "/apis/cdi.kubevirt.io/v1beta1/namespaces/ns/datavolumes/dv/status"
    assert resource_path(STORAGEPROFILES, "ignored", "sc") == "/apis/cdi.kubevirt.io/v1beta1/storageprofiles/sc"
    assert resource_path(NAMESPACES, name="default") == "/api/v1/namespaces/default"
    with pytest.raises(ValueError, match="subresource"):
        resource_path(CONFIGMAPS, "ns", subresource="status")
    assert object_key({"metadata": {"namespace": "ns", "name": "a"}}) == "ns/a" == make_key("ns", "a")
    assert object_key({"metadata": {"name": "sc"}}) == "sc" == make_key(None, "sc")
    assert split_key("ns/a") == ("ns", "a") and split_key("sc") == (None, "sc")


@pytest.mark.parametrize(("old", "new"), [
    ({"a": 1, "b": {"c": 2, "d": 3}}, {"a": 1, "b": {"c": 5}, "e": [1, 2]}),
    ({"metadata": {"labels": {"x": "1"}}}, {"metadata": {"labels": {}}}),
    ({"l": [1, 2]}, {"l": [2]}),
    ({}, {"x": {"y": {"z": 1}}}),
])
def test_merge_diff_round_trips(old: dict[str, object], new: dict[str, object]) -> None:
    patch = merge_diff(old, new)
    assert _apply_merge(old, patch) == new
    assert merge_diff(new, new) == {}


def _apply_merge(target: object, patch: object) -> object:
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _apply_merge(result.get(key), value)
    return result


def test_finalizer_and_resource_version_patches() -> None:
    obj = {"metadata": {"name": "a", "resourceVersion": "7"}}
    added = jsonpatch.apply_patch(obj, add_finalizer_patch(obj, "cdi.kubevirt.io/f"))
    assert added["metadata"]["finalizers"] == ["cdi.kubevirt.io/f"]
    assert add_finalizer_patch(added, "cdi.kubevirt.io/f") == []
    two = jsonpatch.apply_patch(added, add_finalizer_patch(added, "other"))
    assert two["metadata"]["finalizers"] == ["cdi.kubevirt.io/f", "other"]
    removed = jsonpatch.apply_patch(two, remove_finalizer_patch(two, "cdi.kubevirt.io/f"))
    assert removed["metadata"]["finalizers"] == ["other"]
    stale = {"metadata": {**obj["metadata"], "resourceVersion": "8"}}
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(stale, add_finalizer_patch(obj, "x"))
    assert with_resource_version({"spec": {}}, "9") == {"spec": {}, "metadata": {"resourceVersion": "9"}}


def test_backoff_grows_with_jitter_and_resets() -> None:
    backoff = Backoff(initial=1, maximum=8, factor=2, jitter=0.5, rng=random.Random(1))
    delays = [backoff.next() for _ in range(6)]
    for delay, base in zip(delays, [1, 2, 4, 8, 8, 8], strict=True):
        assert base <= delay <= base * 1.5
    backoff.reset()
    assert backoff.next() <= 1.5
    with pytest.raises(ValueError, match="backoff"):
        Backoff(initial=2, maximum=1)
