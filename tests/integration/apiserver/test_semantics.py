"""Kubernetes API semantics of the embedded server, observed over HTTPS as any client sees them:
identity fields, revisions and conflicts, status subresources, patches, errors as Status bodies."""

from __future__ import annotations

import aiohttp

from tests.integration.apiserver.conftest import CM, DV, PODS, Api, configmap, datavolume


async def test_requests_without_a_valid_token_get_401(api: Api) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=False)) as anonymous:
        async with anonymous.get(api.url + "/api/v1/namespaces") as resp:
            assert resp.status == 401
            assert (await resp.json())["reason"] == "Unauthorized"
        async with anonymous.get(api.url + "/api/v1/namespaces", headers={"Authorization": "Bearer nope"}) as resp:
            assert resp.status == 401
        async with anonymous.get(api.url + "/version") as resp:
            assert resp.status == 200


async def test_create_fills_identity_and_generate_name(api: Api) -> None:
    created = await api.ok("POST", CM, configmap("", generateName="gen-"))
    meta = created["metadata"]
    assert meta["name"].startswith("gen-") and len(meta["name"]) == len("gen-") + 5
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert "generation" not in meta and meta["namespace"] == "default"  # built-ins carry none
    status, body = await api.call("POST", CM, configmap(meta["name"]))
    assert status == 409 and body["reason"] == "AlreadyExists"
    assert body["message"] == f'configmaps "{meta["name"]}" already exists'


async def test_resource_versions_increase_and_stale_writes_conflict(api: Api) -> None:
    first = await api.ok("POST", DV, datavolume("rv"))
    rv1 = int(first["metadata"]["resourceVersion"])
    first["metadata"]["labels"] = {"a": "b"}
    second = await api.ok("PUT", f"{DV}/rv", first)
    rv2 = int(second["metadata"]["resourceVersion"])
    assert rv2 > rv1
    first["metadata"]["resourceVersion"] = str(rv1)  # stale
    status, body = await api.call("PUT", f"{DV}/rv", first)
    assert status == 409 and body["reason"] == "Conflict"
    assert "the object has been modified" in body["message"]
    status, _ = await api.call("PATCH", f"{DV}/rv", {"metadata": {"resourceVersion": str(rv1), "labels": {"x": "y"}}},
                               content_type="application/merge-patch+json")
    assert status == 409
    listed = await api.ok("GET", DV)
    assert int(listed["metadata"]["resourceVersion"]) >= rv2


async def test_generation_moves_with_spec_changes_only(api: Api) -> None:
    await api.ok("POST", DV, datavolume("gen"))
    merge = {"content_type": "application/merge-patch+json"}
    labelled = await api.ok("PATCH", f"{DV}/gen", {"metadata": {"labels": {"a": "1"}}}, **merge)
    assert labelled["metadata"]["generation"] == 1
    with_status = await api.ok("PATCH", f"{DV}/gen/status", {"status": {"phase": "Pending"}}, **merge)
    assert with_status["metadata"]["generation"] == 1
    changed = await api.ok("PATCH", f"{DV}/gen", {"spec": {"contentType": "archive"}}, **merge)
    assert changed["metadata"]["generation"] == 2


async def test_status_subresource_is_separate_from_the_main_resource(api: Api) -> None:
    merge = {"content_type": "application/merge-patch+json"}
    created = await api.ok("POST", DV, {**datavolume("st"), "status": {"phase": "Succeeded"}})
    assert "status" not in created  # create cannot set status
    via_main = await api.ok("PATCH", f"{DV}/st", {"status": {"phase": "Failed"}, "metadata": {"labels": {"l": "1"}}},
                            **merge)
    assert "status" not in via_main and via_main["metadata"]["labels"] == {"l": "1"}
    via_status = await api.ok("PATCH", f"{DV}/st/status",
                              {"status": {"phase": "Pending"}, "spec": {"contentType": "archive"}}, **merge)
    assert via_status["status"] == {"phase": "Pending"}
    assert via_status["spec"].get("contentType") is None  # spec changes through /status are ignored
    whole = await api.ok("GET", f"{DV}/st")
    whole["status"] = {"phase": "Failed"}
    replaced = await api.ok("PUT", f"{DV}/st", whole)
    assert replaced["status"] == {"phase": "Pending"}


async def test_no_op_update_keeps_the_revision(api: Api) -> None:
    created = await api.ok("POST", CM, configmap("noop"))
    again = await api.ok("PUT", f"{CM}/noop", created)
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


async def test_patch_formats(api: Api) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "1"}},
           "spec": {"containers": [{"name": "one", "image": "x"}, {"name": "two", "image": "y"}]}}
    await api.ok("POST", PODS, pod)
    strategic = await api.ok(
        "PATCH", f"{PODS}/p", {"spec": {"containers": [{"name": "two", "image": "z"}]}},
        content_type="application/strategic-merge-patch+json")
    assert [(c["name"], c["image"]) for c in strategic["spec"]["containers"]] == [("one", "x"), ("two", "z")]
    merged = await api.ok("PATCH", f"{PODS}/p", {"metadata": {"labels": {"a": None, "b": "2"}}},
                          content_type="application/merge-patch+json")
    assert merged["metadata"]["labels"] == {"b": "2"}
    jsonp = await api.ok("PATCH", f"{PODS}/p", [{"op": "add", "path": "/metadata/annotations", "value": {"n": "1"}}],
                         content_type="application/json-patch+json")
    assert jsonp["metadata"]["annotations"] == {"n": "1"}
    status, body = await api.call("PATCH", f"{PODS}/p", [{"op": "test", "path": "/metadata/name", "value": "q"}],
                                  content_type="application/json-patch+json")
    assert status == 422
    await api.ok("POST", DV, datavolume("smp"))
    status, body = await api.call("PATCH", f"{DV}/smp", {"metadata": {"labels": {"a": "b"}}},
                                  content_type="application/strategic-merge-patch+json")
    assert status == 415 and "application/merge-patch+json" in body["message"]


async def test_bad_requests_get_status_bodies_naming_the_problem(api: Api) -> None:
    status, body = await api.call("GET", "/apis/cdi.kubevirt.io/v1beta1/namespaces/default/nothings")
    assert status == 404 and body["kind"] == "Status"
    status, body = await api.call("GET", f"{DV}/missing")
    assert status == 404 and body["message"] == 'datavolumes.cdi.kubevirt.io "missing" not found'
    status, body = await api.call("POST", DV, raw=b"{not json")
    assert status == 400 and "could not be decoded" in body["message"]
    status, body = await api.call("POST", DV, datavolume("bad", contentType="zip"))
    assert status == 422 and body["reason"] == "Invalid"
    assert body["details"]["causes"][0]["field"] == "spec.contentType"
    assert 'Unsupported value: "zip"' in body["message"]
    status, body = await api.call("POST", DV + "?fieldValidation=Strict", datavolume("bad", extra=1))
    assert status == 400 and 'unknown field "spec.extra"' in body["message"]
    status, body = await api.call("POST", "/api/v1/namespaces/nowhere/configmaps", configmap("x"))
    assert status == 404 and body["message"] == 'namespaces "nowhere" not found'
    status, body = await api.call("POST", CM, configmap("Bad_Name"))
    assert status == 422 and body["details"]["causes"][0]["field"] == "metadata.name"


async def test_unknown_fields_are_pruned_when_not_strict(api: Api) -> None:
    created = await api.ok("POST", DV + "?fieldValidation=Ignore", datavolume("prune", extra=1))
    assert "extra" not in created["spec"]


async def test_label_and_field_selectors(api: Api) -> None:
    for name, labels in [("a", {"env": "prod", "tier": "db"}), ("b", {"env": "dev"}), ("c", {})]:
        await api.ok("POST", CM, configmap(name, labels))

    async def names(query: str) -> list[str]:
        body = await api.ok("GET", f"{CM}?{query}")
        return sorted(i["metadata"]["name"] for i in body["items"] if i["metadata"]["name"] in "abc")

    assert await names("labelSelector=env%3Dprod") == ["a"]
    assert await names("labelSelector=env!%3Dprod") == ["b", "c"]
    assert await names("labelSelector=env+in+(prod,dev)") == ["a", "b"]
    assert await names("labelSelector=env+notin+(prod)") == ["b", "c"]
    assert await names("labelSelector=tier") == ["a"]
    assert await names("labelSelector=!tier") == ["b", "c"]
    assert await names("labelSelector=env%3Dprod,tier%3Ddb") == ["a"]
    assert await names("fieldSelector=metadata.name%3Db") == ["b"]
    assert await names("fieldSelector=metadata.name!%3Db") == ["a", "c"]


async def test_list_paging_with_limit_and_continue(api: Api) -> None:
    for i in range(7):
        await api.ok("POST", DV, datavolume(f"page-{i}"))
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        body = await api.ok("GET", f"{DV}?limit=3" + (f"&continue={token}" if token else ""))
        seen += [i["metadata"]["name"] for i in body["items"]]
        pages += 1
        token = body["metadata"].get("continue", "")
        if not token:
            break
        assert body["metadata"]["remainingItemCount"] == 7 - len(seen)
    assert seen == [f"page-{i}" for i in range(7)] and pages == 3


async def test_pages_come_from_the_first_pages_snapshot(api: Api) -> None:
    for i in range(4):
        await api.ok("POST", DV, datavolume(f"snap-{i}"))
    first = await api.ok("GET", f"{DV}?limit=2")
    await api.ok("DELETE", f"{DV}/snap-3")
    await api.ok("POST", DV, datavolume("snap-4"))
    rest = await api.ok("GET", f"{DV}?limit=10&continue={first['metadata']['continue']}")
    assert [i["metadata"]["name"] for i in rest["items"]] == ["snap-2", "snap-3"]
    assert rest["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    status, body = await api.call("GET", f"{DV}?limit=10&continue={first['metadata']['continue']}")
    assert status == 410 and "too old to display a consistent list" in body["message"]


async def test_configmap_data_must_be_strings(api: Api) -> None:
    status, body = await api.call("POST", CM, {**configmap("typed"), "data": {"a": 1}})
    assert status == 400 and "cannot be handled as a ConfigMap" in body["message"]


async def test_table_output_uses_printer_columns(api: Api) -> None:
    await api.ok("POST", DV, datavolume("tbl"))
    await api.ok("PATCH", f"{DV}/tbl/status", {"status": {"phase": "ImportInProgress", "progress": "45.00%",
                                                          "restartCount": 2}},
                 content_type="application/merge-patch+json")
    accept = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}
    body = await api.ok("GET", DV, headers=accept)
    assert body["kind"] == "Table"
    assert [c["name"] for c in body["columnDefinitions"]] == ["Name", "Phase", "Progress", "Restarts", "Age"]
    row = next(r for r in body["rows"] if r["cells"][0] == "tbl")
    assert row["cells"][1:4] == ["ImportInProgress", "45.00%", 2]
    assert row["object"]["kind"] == "PartialObjectMetadata"


async def test_discovery_names_short_names_and_scope(api: Api) -> None:
    body = await api.ok("GET", "/apis/cdi.kubevirt.io/v1beta1")
    dv = next(r for r in body["resources"] if r["name"] == "datavolumes")
    assert dv["shortNames"] == ["dv", "dvs"] and dv["namespaced"] and dv["categories"] == ["all"]
    assert "watch" in dv["verbs"]
    assert any(r["name"] == "datavolumes/status" for r in body["resources"])
    profiles = next(r for r in body["resources"] if r["name"] == "storageprofiles")
    assert profiles["namespaced"] is False
    groups = await api.ok("GET", "/apis")
    assert "snapshot.storage.k8s.io" in [g["name"] for g in groups["groups"]]
    core = await api.ok("GET", "/api/v1")
    pods = next(r for r in core["resources"] if r["name"] == "pods")
    assert pods["shortNames"] == ["po"] and any(r["name"] == "pods/log" for r in core["resources"])


async def test_crds_created_through_the_api_are_served(api: Api) -> None:
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "widgets.example.com"},
           "spec": {"group": "example.com", "scope": "Namespaced",
                    "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
                    "versions": [{"name": "v1", "served": True, "storage": True,
                                  "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                      "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}}}]}}
    created = await api.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    assert {c["type"] for c in created["status"]["conditions"]} == {"Established", "NamesAccepted"}
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": 3}}
    await api.ok("POST", "/apis/example.com/v1/namespaces/default/widgets", widget)
    status, body = await api.call("POST", "/apis/example.com/v1/namespaces/default/widgets",
                                  {**widget, "metadata": {"name": "w2"}, "spec": {"size": "big"}})
    assert status == 422 and "spec.size" in body["message"]
    await api.ok("DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com")
    status, _ = await api.call("GET", "/apis/example.com/v1/namespaces/default/widgets")
    assert status == 404


async def test_protobuf_bodies_from_typed_clients_are_understood(api: Api) -> None:
    # What `kubectl create configmap x --from-literal=a=b` sends: k8s\0 + runtime.Unknown{TypeMeta, raw}
    def field(number: int, payload: bytes) -> bytes:
        return bytes([number << 3 | 2, len(payload)]) + payload

    meta = field(1, b"pb") + field(3, b"")
    entry = field(1, b"a") + field(2, b"b")
    raw = field(1, meta) + field(2, entry)
    unknown = field(1, field(1, b"v1") + field(2, b"ConfigMap")) + field(2, raw)
    created = await api.ok("POST", CM, raw=b"k8s\x00" + unknown, content_type="application/vnd.kubernetes.protobuf")
    assert created["metadata"]["name"] == "pb" and created["data"] == {"a": "b"}
