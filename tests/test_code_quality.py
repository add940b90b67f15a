"""The project's rules that tools can check: ruff, the layering contracts of DESIGN §2
(import-linter), mypy --strict on the packages that promise it, and the contract names spelled in
`cdi/api` only."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = BIN / tool if (BIN / tool).exists() else shutil.which(tool)
    assert exe, f"{tool} is not installed (pip install -e '.[test]')"
    return subprocess.run([str(exe), *args], cwd=ROOT, capture_output=True, text=True, check=False)


def test_ruff_is_clean() -> None:
    result = _run("ruff", "check", "cdi", "tests", "bench")
    assert result.returncode == 0, result.stdout + result.stderr


def test_layering_contracts_hold() -> None:
    result = _run("lint-imports")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("package", ["cdi/api", "cdi/kube", "cdi/controller", "cdi/cloner", "cdi/common",
                                     "cdi/uploadserver", "cdi/uploadproxy"])
def test_mypy_strict(package: str) -> None:
    if not any((ROOT / package).glob("*.py")):
        pytest.skip(f"{package} has no modules yet")
    result = _run("mypy", package)
    assert result.returncode == 0, result.stdout + result.stderr


# Every `cdi.kubevirt.io/...` and `extensions.cdi.dev/...` name (annotations, labels, finalizers), KubeVirt's
# `instancetype.kubevirt.io/...` labels, every worker env name and every env name of the components' own pods
# is a constant in `cdi/api` (DESIGN §2): spelled twice, two spellings drift apart (a key read under one name
# and written under another is a feature that silently stops working). Tests may spell them: they check the
# names. `extensions.cdi.dev/` is ours (`cdi.api.annotations.EXTENSION_PREFIX`): the same rule.
CONTRACT_PREFIXES = ("cdi.kubevirt.io/", "instancetype.kubevirt.io/", "extensions.cdi.dev/")


def _env_names() -> tuple[frozenset[str], tuple[str, ...]]:
    """The env names `cdi.api.env` (the worker pods') and `cdi.api.componentenv` (the components') define
    (their other constants are values and paths), and the prefixes of numbered ones
    (`IMPORTER_EXTRA_HEADER_<n>`)."""
    from cdi.api import componentenv, env

    names = {value for module in (env, componentenv) for key, value in vars(module).items()
             if key.isupper() and isinstance(value, str) and re.fullmatch(r"[A-Z][A-Z0-9_]*|[a-z]+_proxy", value)}
    prefixes = tuple(sorted(name for name in names if name.endswith("_")))
    return frozenset(names - set(prefixes)), prefixes


def test_contract_names_are_spelled_only_in_cdi_api() -> None:
    names, prefixes = _env_names()
    assert {"IMPORTER_SOURCE", "UPLOAD_IMAGE_SIZE", "DESTINATION", "UPLOAD_URL", "MOUNT_POINT"} <= names
    assert {"POD_NAMESPACE", "PULL_POLICY", "OPERATOR_VERSION", "CONTROLLER_IMAGE"} <= names
    offences = []
    for path in sorted((ROOT / "cdi").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith("cdi/api/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                value = node.value
                if value.startswith(CONTRACT_PREFIXES) or value in names or value.startswith(prefixes):
                    offences.append(f"{relative}:{node.lineno}: {value!r}")
    assert not offences, "spell these with the constants of cdi/api:\n" + "\n".join(offences)


def test_owner_references_are_written_by_one_helper() -> None:
    """`cdi.api.owners.owner_reference` is the one owner reference the controller and the operator write
    (`controller`, `blockOwnerDeletion`: a foreground delete of the owner waits for what it owns), so the
    references of the two cannot drift apart. The embedded API server reads the field, so it may spell it."""
    offences = [path.relative_to(ROOT).as_posix() for path in sorted((ROOT / "cdi").rglob("*.py"))
                if "blockOwnerDeletion" in path.read_text()]
    assert [path for path in offences if not path.startswith("cdi/embedded/")] == ["cdi/api/owners.py"]


def test_e2e_tests_do_not_import_the_integration_tests() -> None:
    """What the end-to-end tests share with the integration tests (servers, images, credentials) lives in
    `tests/support`: an integration test's module is free to change for its own tests."""
    offenders = [str(path.relative_to(ROOT)) for path in sorted((ROOT / "tests" / "e2e").rglob("*.py"))
                 if re.search(r"^\s*(from|import)\s+tests\.integration\b", path.read_text(), re.MULTILINE)]
    assert offenders == []


def test_no_module_imports_itself_through_others() -> None:
    """No import cycle between cdi's modules (lazy imports inside functions count too): a circle means a
    type or helper lives on the wrong side of it (`ImportOptions` once sat in the pipeline that imports the
    routes reading it). Reported as the strongly connected groups of modules."""
    import grimp

    graph = grimp.build_graph("cdi")
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m) & graph.modules) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in edges[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in modules:
        if module not in index:
            visit(module)
    assert cycles == []
