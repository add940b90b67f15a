"""Kubernetes API semantics of the embedded server, observed over HTTPS as any client sees them:
identity fields, revisions and conflicts, status subresources, patches, errors as Status bodies."""

from __future__ import annotations

import aiohttp

from tests.integration.kubeapi.conftest import CM, DV, PODS, Api, configmap, datavolume


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


async def test_a_stored_version_stays_declared_until_a_migration_drops_it(api: Api) -> None:
    """kube-apiserver's rule, which installing over an older CRD meets: a version the CRD's status says
    objects may still be stored in cannot leave spec.versions; a status write (a storage migration) that
    drops it from storedVersions can, and must keep the storage version."""
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}

    def crd(*versions: tuple[str, bool]) -> dict[str, object]:
        return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": "gadgets.example.com"},
                "spec": {"group": "example.com", "scope": "Cluster",
                         "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
                         "versions": [{"name": n, "served": True, "storage": s, "schema": schema}
                                      for n, s in versions]}}

    created = await api.ok("POST", crds, crd(("v1alpha1", True)))
    assert created["status"]["storedVersions"] == ["v1alpha1"]
    moved = await api.ok("PUT", f"{crds}/gadgets.example.com", {
        **crd(("v1alpha1", False), ("v1beta1", True)),
        "metadata": {"name": "gadgets.example.com", "resourceVersion": created["metadata"]["resourceVersion"]}})
    assert moved["status"]["storedVersions"] == ["v1alpha1", "v1beta1"]
    status, body = await api.call("PATCH", f"{crds}/gadgets.example.com", crd(("v1beta1", True)),
                                  content_type="application/merge-patch+json")
    assert status == 422, body
    assert 'status.storedVersions[0]: Invalid value: "v1alpha1": must appear in spec.versions' in body["message"]
    status, body = await api.call("PATCH", f"{crds}/gadgets.example.com/status",
                                  {"status": {"storedVersions": ["v1alpha1"]}},
                                  content_type="application/merge-patch+json")
    assert status == 422 and "must have the storage version v1beta1" in body["message"], body
    await api.ok("PATCH", f"{crds}/gadgets.example.com/status", {"status": {"storedVersions": ["v1beta1"]}},
                 content_type="application/merge-patch+json")
    dropped = await api.ok("PATCH", f"{crds}/gadgets.example.com", crd(("v1beta1", True)),
                           content_type="application/merge-patch+json")
    assert [v["name"] for v in dropped["spec"]["versions"]] == ["v1beta1"]
    assert dropped["status"]["storedVersions"] == ["v1beta1"]


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


# -- hostile and malformed requests: a 4xx Status as kube-apiserver answers, never a 500 or a hang --------


def _status(body: object, code: int, reason: str) -> dict[str, object]:
    """`body` as kube-apiserver's Status for a failed request, checked field by field."""
    assert isinstance(body, dict), body
    assert body["kind"] == "Status" and body["apiVersion"] == "v1" and body["metadata"] == {}, body
    assert body["status"] == "Failure" and body["code"] == code and body["reason"] == reason, body
    return body


async def test_deeply_nested_bodies_are_refused_with_400(api: Api) -> None:
    deep = 10**5
    for content_type, text in [("application/yaml", b"[" * deep + b"]" * deep),
                               ("application/yaml", b"{a: " * deep + b"b" + b"}" * deep),
                               ("application/json", b"[" * deep + b"]" * deep),
                               ("application/json", b'{"a":' * 300 + b"1" + b"}" * 300)]:
        status, body = await api.call("POST", CM, raw=text, content_type=content_type)
        assert status == 400, (content_type, text[:10], body)
        assert "exceeded max depth" in str(_status(body, 400, "BadRequest")["message"])
    await api.ok("POST", CM, raw=b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: fine}\n",
                 content_type="application/yaml")


async def test_a_json_patch_that_nests_an_object_too_deep_is_refused_with_400(api: Api) -> None:
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "trees.example.com"},
           "spec": {"group": "example.com", "scope": "Namespaced",
                    "names": {"plural": "trees", "singular": "tree", "kind": "Tree"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                        "type": "object", "properties": {
                            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}}]}}
    await api.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    trees = "/apis/example.com/v1/namespaces/default/trees"
    branch: list[object] = []
    for _ in range(150):
        branch = [branch]
    await api.ok("POST", trees, {"apiVersion": "example.com/v1", "kind": "Tree", "metadata": {"name": "t"},
                                 "spec": {"branch": branch}})
    # each part is within bounds; the value lands 150 levels down, the object ends up 300 deep
    patch = [{"op": "add", "path": "/spec/branch" + "/0" * 149 + "/-", "value": branch}]
    status, body = await api.call("PATCH", f"{trees}/t", patch, content_type="application/json-patch+json")
    assert status == 400, body
    assert "exceeded max depth" in str(_status(body, 400, "BadRequest")["message"])
    await api.ok("GET", f"{trees}/t")


async def test_yaml_aliases_that_expand_past_any_body_size_are_refused(api: Api) -> None:
    lines = ["apiVersion: v1", "kind: ConfigMap", "metadata: {name: laughs}", "x:", "  l0: &l0 [lol, lol, lol]"]
    lines += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 8)]  # 3 * 9**7 strings
    status, body = await api.call("POST", CM, raw="\n".join(lines).encode(), content_type="application/yaml")
    assert status == 400, body
    assert "excessive aliasing" in str(_status(body, 400, "BadRequest")["message"])


async def test_a_body_over_the_size_limit_is_a_413_status(api: Api) -> None:
    status, body = await api.call("POST", CM, raw=b" " * (3 * 1024 * 1024 + 1))
    assert status == 413
    assert _status(body, 413, "RequestEntityTooLarge")["message"] == "Request entity too large: limit is 3145728"


async def test_query_parameters_that_are_not_integers_are_400(api: Api) -> None:
    await api.ok("POST", CM, configmap("int"))
    for method, path in [("GET", f"{CM}?limit=ten"), ("GET", f"{CM}?watch=true&timeoutSeconds=1.5"),
                         ("DELETE", f"{CM}/int?gracePeriodSeconds=soon")]:
        status, body = await api.call(method, path)
        assert status == 400, (path, body)
        assert str(_status(body, 400, "BadRequest")["message"]).startswith("strconv.ParseInt: parsing ")
    status, body = await api.call("DELETE", f"{CM}/int", {"gracePeriodSeconds": "soon"})
    assert status == 400 and "DeleteOptions.gracePeriodSeconds" in str(_status(body, 400, "BadRequest")["message"])


async def test_a_limit_of_zero_or_less_is_no_limit(api: Api) -> None:
    for i in range(3):
        await api.ok("POST", CM, configmap(f"nolimit-{i}"))
    for limit in ("-1", "0"):
        body = await api.ok("GET", f"{CM}?limit={limit}")
        assert [i["metadata"]["name"] for i in body["items"]] == [f"nolimit-{i}" for i in range(3)]
        assert "continue" not in body["metadata"] and "remainingItemCount" not in body["metadata"]


async def test_field_selectors_on_fields_a_kind_does_not_support_are_400(api: Api) -> None:
    cases = [
        (f"{CM}?fieldSelector=data.k%3Dv",
         '"data.k" is not a known field selector: only "metadata.name", "metadata.namespace"'),
        (f"{DV}?fieldSelector=spec.contentType%3Darchive", "field label not supported: spec.contentType"),
        (f"{PODS}?fieldSelector=spec.nodeName%3Dn,spec.priority%3D1", "field label not supported: spec.priority"),
        ("/api/v1/namespaces?fieldSelector=metadata.namespace%3Ddefault",
         "field label not supported: metadata.namespace"),
        (f"{CM}?watch=true&fieldSelector=data.k%3Dv",
         '"data.k" is not a known field selector: only "metadata.name", "metadata.namespace"'),
    ]
    for path, message in cases:
        status, body = await api.call("GET", path)
        assert status == 400, (path, body)
        assert _status(body, 400, "BadRequest")["message"] == message
    status, body = await api.call("DELETE", f"{CM}?fieldSelector=data.k%3Dv")
    assert status == 400 and _status(body, 400, "BadRequest")["message"].startswith('"data.k" is not a known')


async def test_field_selectors_a_kind_supports_select(api: Api) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sel"},
           "spec": {"containers": [{"name": "c", "image": "busybox"}], "restartPolicy": "Never"}}
    await api.ok("POST", PODS, pod)

    async def pods(selector: str) -> list[str]:
        body = await api.ok("GET", f"{PODS}?fieldSelector={selector}")
        return [i["metadata"]["name"] for i in body["items"]]

    assert await pods("spec.restartPolicy%3DNever") == ["sel"]
    assert await pods("spec.hostNetwork%3Dfalse") == ["sel"]  # left out of the object, false all the same
    assert await pods("spec.restartPolicy%3DAlways") == []
    await api.ok("GET", "/api/v1/events?fieldSelector=involvedObject.kind%3DPod,source%3Dkubelet")


async def test_reads_at_a_resource_version_the_store_has_not_reached_are_504(api: Api) -> None:
    await api.ok("POST", CM, configmap("future"))
    current = int((await api.ok("GET", CM))["metadata"]["resourceVersion"])
    for path in (f"{CM}?resourceVersion={current + 1000}", f"{CM}/future?resourceVersion={current + 1000}"):
        async with api.session.get(api.url + path) as resp:
            body = await resp.json()
            assert resp.status == 504 and resp.headers["Retry-After"] == "1", body
        status = _status(body, 504, "Timeout")
        assert status["message"] == f"Timeout: Too large resource version: {current + 1000}, current: {current}"
        assert status["details"] == {"causes": [{"reason": "ResourceVersionTooLarge",
                                                 "message": "Too large resource version"}],
                                     "retryAfterSeconds": 1}
    await api.ok("GET", f"{CM}?resourceVersion={current}")
    await api.ok("GET", f"{CM}?resourceVersion=0")
    status, body = await api.call("GET", f"{CM}?resourceVersion=abc")
    assert status == 400 and _status(body, 400, "BadRequest")["message"] == (
        'invalid resource version: resourceVersion: Invalid value: "abc": strconv.ParseUint: parsing "abc": '
        "invalid syntax")
