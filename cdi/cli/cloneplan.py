"""`cdi clone-plan -f dv.yaml`: which strategy a clone DataVolume will run and why, before anything
moves. It reads what the controller reads (storage classes, StorageProfiles, VolumeSnapshotClasses,
the CDI resource, the source and its DataSource) and asks the same planner; the line it prints is
the one the `CloneScheduled` event carries."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from cdi.api import groups
from cdi.api.rendering import ClusterStorage, RenderError
from cdi.api.views import CDIView, ClaimView, DataSourceView, DataVolumeView, ObjectView, SnapshotView
from cdi.common import aioloop
from cdi.controller.clone import planner
from cdi.controller.clone import size as clonesize
from cdi.controller.datasource import ChainError
from cdi.controller.datavolume.clones import SourceMissing, plan_datavolume
from cdi.kube import ApiError, KubeClient, NotFound

Obj = dict[str, Any]


def register(commands: Any) -> None:
    parser = commands.add_parser("clone-plan", help="say which clone strategy a DataVolume will get, and why")
    parser.add_argument("-f", "--filename", required=True, help="the DataVolume manifest (YAML or JSON, - for stdin)")
    parser.add_argument("-n", "--namespace", default="", help="namespace (default: the manifest's, else the "
                                                              "kubeconfig context's)")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig (default $KUBECONFIG, then ~/.kube/config)")
    parser.set_defaults(run=run)


async def _get(client: KubeClient, gvr: groups.GVR, name: str, namespace: str | None) -> Obj | None:
    try:
        result: Obj = await client.get(gvr, name, namespace)
        return result
    except NotFound:
        return None


async def _fetch(client: KubeClient, dv: Obj) -> dict[tuple[str, str, str], Obj]:
    """The few named objects the planner may look up: DataSources, the source, its snapshot content."""
    store: dict[tuple[str, str, str], Obj] = {}
    view = DataVolumeView(dv)
    namespace = view.namespace

    async def put(gvr: groups.GVR, name: str, ns: str) -> Obj | None:
        obj = await _get(client, gvr, name, ns or None)
        if obj is not None:
            store[(gvr.plural, ns, name)] = obj
        return obj

    refs: list[tuple[str, str]] = []
    ref = view.source_ref
    if ref is not None:
        ds_ns = str(ref.get("namespace") or namespace)
        data_source = await put(groups.DATASOURCES, str(ref.get("name")), ds_ns)
        chained = DataSourceView(data_source or {}).source_of("dataSource")
        if chained is not None:
            data_source = await put(groups.DATASOURCES, str(chained.get("name")),
                                    str(chained.get("namespace") or ds_ns))
        for kind in ("pvc", "snapshot"):
            source = DataSourceView(data_source or {}).source_of(kind)
            if source is not None:
                refs.append((kind, f"{source.get('namespace') or ds_ns}/{source.get('name')}"))
    for kind in ("pvc", "snapshot"):
        source = view.source.get(kind)
        if source is not None:
            refs.append((kind, f"{source.get('namespace') or namespace}/{source.get('name')}"))
    for kind, key in refs:
        ns, _, name = key.partition("/")
        obj = await put(groups.PVCS if kind == "pvc" else groups.VOLUMESNAPSHOTS, name, ns)
        content = SnapshotView(obj).content_name if kind == "snapshot" and obj is not None else None
        if content:
            await put(groups.VOLUMESNAPSHOTCONTENTS, str(content), "")
    return store


async def explain(client: KubeClient, dv: Obj) -> tuple[int, str]:
    store = await _fetch(client, dv)
    classes = (await client.list_all(groups.STORAGECLASSES)).items
    profiles = {ObjectView(p).name: p for p in (await client.list_all(groups.STORAGEPROFILES)).items}
    try:
        snapshot_classes = (await client.list_all(groups.VOLUMESNAPSHOTCLASSES)).items
    except NotFound:
        snapshot_classes = []
    cdi = next(iter((await client.list_all(groups.CDIS)).items), None)
    config = await _get(client, groups.CDICONFIGS, groups.CDI_CONFIG_NAME, None) or {}
    override = CDIView(cdi or {}).clone_strategy_override
    cluster = planner.Cluster(classes, profiles, snapshot_classes, override or None)
    storage = ClusterStorage(classes, profiles, ObjectView(config).status)

    def lookup(gvr: groups.GVR, name: str, namespace: str) -> Obj | None:
        return store.get((gvr.plural, namespace if gvr.namespaced else "", name))

    try:
        decided = plan_datavolume(dv, lookup, storage, cluster)
    except (ChainError, SourceMissing, RenderError) as exc:
        return 1, f"no clone can be planned yet: {exc}"
    except planner.CloneValidationError as exc:
        return 1, f"{planner.MESSAGE_CLONE_VALIDATION_FAILED}: {exc}"
    except clonesize.NeedsVirtualSize as exc:
        return 0, f"size: not known yet: a size-detection pod will measure {exc} when the clone starts (the " \
                  "strategy depends on it)"
    source, plan = decided.source, decided.plan
    name = DataVolumeView(dv).key
    lines = [f"Cloning from {source.namespace}/{source.name} into {name} scheduled: {plan.why}",
             f"strategy: {plan.strategy}"]
    if plan.fallback_reason:
        lines.append(f"fallback: {plan.fallback_reason}: {plan.fallback_message}")
    lines.append(f"size: {ClaimView({'spec': decided.spec}).requested_storage or None}")
    return 0, "\n".join(lines)


async def _run(args: argparse.Namespace, text: str) -> int:
    dv = yaml.safe_load(text)
    if not isinstance(dv, dict) or dv.get("kind") != "DataVolume":
        print("error: the manifest is not a DataVolume", file=sys.stderr)
        return 2
    async with await KubeClient.connect(args.kubeconfig) as client:
        dv.setdefault("metadata", {})["namespace"] = args.namespace or DataVolumeView(dv).namespace or \
            client.namespace or "default"
        try:
            code, text = await explain(client, dv)
        except ApiError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    print(text, file=sys.stdout if code == 0 else sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    if args.filename == "-":
        text = sys.stdin.read()
    else:
        with open(args.filename, encoding="utf-8") as manifest:
            text = manifest.read()
    result: int = aioloop.run(_run(args, text))
    return result
