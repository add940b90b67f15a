"""Users other than the admin, as a cluster admin sets them up on `cdi up`: the default roles `admin`,
`edit` and `view` (with CDI's aggregated into them), and what the real kubectl shows them about
themselves (`auth whoami`, `auth can-i --list`), impersonation with user extras included (issues #26,
#27)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator

import pytest

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
