"""Users other than the admin, as a cluster admin sets them up on `cdi up`: the default roles `admin`,
`edit` and `view` (with CDI's aggregated into them), and what the real kubectl shows them about
themselves (`auth whoami`, `auth can-i --list`), impersonation with user extras included (issues #26,
#27)."""

from __future__ import annotations

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


def test_admin_of_a_namespace_reads_and_writes_what_edit_and_view_grant(k: Kubectl) -> None:
    ns = new_namespace(k, "admin")
    k("create", "rolebinding", "bob-admin", "--clusterrole=admin", "--user=bob", "-n", ns)
    listed = k("get", "pvc", "-n", ns, "--token", "bob-token", check=False)
    assert listed.returncode == 0, listed.stderr
    assert f"No resources found in {ns} namespace." in listed.stderr
    k("create", "configmap", "settings", "--from-literal=a=b", "-n", ns, "--token", "bob-token")
    k("create", "rolebinding", "carol-view", "--clusterrole=view", "--user=carol", "-n", ns, "--token", "bob-token")
    assert "persistentvolumeclaims" in k("describe", "clusterrole", "admin").stdout
