"""Users other than the admin, as a cluster admin sets them up on `cdi up`: the default roles `admin`,
`edit` and `view` (with CDI's aggregated into them), and what the real kubectl shows them about
themselves (`auth whoami`, `auth can-i --list`), impersonation with user extras included (issues #26,
#27)."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.target import External, own_cluster
from tests.e2e.workloads import new_namespace
from tests.support.cluster import CdiUp, Kubectl

TOKENS = 'bob-token,bob,1001\ncarol-token,carol,1002,"devs"\n'


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiUp | External]:
    tokens = tmp_path_factory.mktemp("tokens") / "tokens.csv"
    tokens.write_text(TOKENS)
    yield from own_cluster(tmp_path_factory, "auth", "--token-auth-file", str(tokens))


@pytest.fixture(scope="module")
def k(cluster: CdiUp | External, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    return Kubectl(cluster.kubeconfig, tmp_path_factory.mktemp("kc"))


def blank_dv(name: str) -> str:
    return textwrap.dedent(f"""\
        apiVersion: cdi.kubevirt.io/v1beta1
        kind: DataVolume
        metadata:
          name: {name}
        spec:
          source:
            blank: {{}}
          storage:
            resources:
              requests:
                storage: 16Mi
        """)


def test_admin_of_a_namespace_reads_and_writes_what_edit_and_view_grant(k: Kubectl) -> None:
    ns = new_namespace(k, "admin")
    k("create", "rolebinding", "bob-admin", "--clusterrole=admin", "--user=bob", "-n", ns)
    listed = k("get", "pvc", "-n", ns, "--token", "bob-token", check=False)
    assert listed.returncode == 0, listed.stderr
    assert f"No resources found in {ns} namespace." in listed.stderr
    k("create", "configmap", "settings", "--from-literal=a=b", "-n", ns, "--token", "bob-token")
    k("create", "rolebinding", "carol-view", "--clusterrole=view", "--user=carol", "-n", ns, "--token", "bob-token")
    assert "persistentvolumeclaims" in k("describe", "clusterrole", "admin").stdout


def test_edit_creates_datavolumes_and_view_reads_them(k: Kubectl) -> None:
    ns = new_namespace(k, "cdiroles")
    k("create", "rolebinding", "bob-edit", "--clusterrole=edit", "--user=bob", "-n", ns)
    k("create", "rolebinding", "carol-view", "--clusterrole=view", "--group=devs", "-n", ns)
    created = k("create", "-f", "-", "-n", ns, "--token", "bob-token", input=blank_dv("bobs"), check=False)
    assert created.returncode == 0, created.stderr
    assert "datavolume.cdi.kubevirt.io/bobs created" in created.stdout
    assert "bobs" in k("get", "dv", "-n", ns, "--token", "carol-token").stdout
    refused = k("create", "-f", "-", "-n", ns, "--token", "carol-token", input=blank_dv("carols"), check=False)
    assert refused.returncode == 1
    assert 'User "carol" cannot create resource "datavolumes"' in refused.stderr
    # every authenticated user reads CDI's configuration, as CDI's config-reader binding says
    assert k("get", "cdiconfig", "--token", "carol-token").returncode == 0
    roles = k("get", "clusterroles", "-l", "cdi.kubevirt.io", "-o", "name").stdout.split()
    assert {"clusterrole.rbac.authorization.k8s.io/cdi.kubevirt.io:" + role
            for role in ("admin", "edit", "view", "config-reader")} <= set(roles)


def test_can_i_list_prints_the_rules_of_the_namespace(k: Kubectl) -> None:
    ns = new_namespace(k, "rules")
    k.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "dv-reader", "namespace": ns},
             "rules": [{"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes"], "verbs": ["get", "list"]},
                       {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["settings"],
                        "verbs": ["get"]}]})
    k("create", "rolebinding", "bob-reads", "--role=dv-reader", "--user=bob", "-n", ns)
    listed = k("auth", "can-i", "--list", "-n", ns, "--token", "bob-token", check=False)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert rows[0] == ["Resources", "Non-Resource", "URLs", "Resource", "Names", "Verbs"]
    assert ["datavolumes.cdi.kubevirt.io", "[]", "[]", "[get", "list]"] in rows
    assert ["configmaps", "[]", "[settings]", "[get]"] in rows
    assert ["selfsubjectaccessreviews.authorization.k8s.io", "[]", "[]", "[create]"] in rows  # system:basic-user
    assert ["[/version]", "[]", "[get]"] in rows  # system:discovery
    elsewhere = k("auth", "can-i", "--list", "-n", "default", "--token", "bob-token").stdout
    assert "datavolumes" not in elsewhere


def table(text: str) -> list[list[str]]:
    """kubectl's columns (two spaces or more apart) of each line."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()]


def test_whoami_names_the_user_and_groups(k: Kubectl) -> None:
    shown = k("auth", "whoami", "--token", "carol-token", check=False)
    assert shown.returncode == 0, shown.stderr
    rows = table(shown.stdout)
    assert ["Username", "carol"] in rows and ["UID", "1002"] in rows
    assert ["Groups", "[devs system:authenticated]"] in rows


def impersonating(k: Kubectl, path: Path, token: str, user: str, extra: dict[str, list[str]]) -> Kubectl:
    """A kubeconfig whose user is `token`'s, acting as `user` with `extra` (kubectl sends
    `Impersonate-User` and one `Impersonate-Extra-<key>` per value)."""
    config = yaml.safe_load(k.kubeconfig.read_text())
    config["users"] = [{"name": "admin", "user": {"token": token, "as": user, "as-user-extra": extra}}]
    path.write_text(yaml.safe_dump(config))
    return Kubectl(path, path.parent)


def test_impersonating_user_extras_needs_their_own_grant(k: Kubectl, tmp_path: Path) -> None:
    k.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": "impersonate-alice"},
             "rules": [{"apiGroups": [""], "resources": ["users"], "resourceNames": ["alice"],
                        "verbs": ["impersonate"]}]})
    k("create", "clusterrolebinding", "bob-impersonates", "--clusterrole=impersonate-alice", "--user=bob")
    as_alice = impersonating(k, tmp_path / "kubeconfig", "bob-token", "alice", {"scopes": ["view"]})
    refused = as_alice("get", "--raw", "/api/v1/namespaces/default/configmaps", check=False)
    assert refused.returncode == 1
    assert as_alice("auth", "whoami", check=False).returncode == 1
    assert ('userextras.authentication.k8s.io "view" is forbidden: User "bob" cannot impersonate resource '
            '"userextras/scopes" in API group "authentication.k8s.io" at the cluster scope') in refused.stderr

    k.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": "impersonate-alice"},
             "rules": [{"apiGroups": [""], "resources": ["users"], "resourceNames": ["alice"],
                        "verbs": ["impersonate"]},
                       {"apiGroups": ["authentication.k8s.io"], "resources": ["userextras/scopes"],
                        "resourceNames": ["view"], "verbs": ["impersonate"]}]})
    rows = table(as_alice("auth", "whoami").stdout)
    assert ["Username", "alice"] in rows
    assert ["Extra: scopes", "[view]"] in rows
