"""Every values file under charts/simbridge/ci/ renders, and every rendered object is validated with
kubernetes-validate --strict against the Kubernetes 1.35, 1.36 and 1.37 schemas (custom resources
against the vendored CRD schemas); helm lint --strict is clean for each."""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.unit.chart_support import (
    CHART,
    CI_FILES,
    CRD_KINDS,
    K8S_VERSIONS,
    NAMESPACE,
    RELEASE,
    WORKLOAD_KINDS,
    Obj,
    Renderer,
    crd_validators,
    helm,
    kv,
    load_values,
    renderer_fixture,  # noqa: F401 - the module-scoped fixture
    yaml,
)


@pytest.fixture(scope="module")
def cached_validator() -> Iterator[Callable[[Obj, str], None]]:
    """kubernetes_validate.validate(strict=True), with its schema files read once per run.

    kubernetes-validate re-reads its 1.5 MB definitions file on every call; caching the reads keeps
    a few hundred validations well under a second. The validation itself is the library's own.
    """
    utils = kv.utils
    original = getattr(utils, "schema_contents", None)
    if original is not None:
        utils.schema_contents = functools.lru_cache(maxsize=None)(original)

    def validate(obj: Obj, version: str) -> None:
        kv.validate(obj, version, strict=True)

    yield validate
    if original is not None:
        utils.schema_contents = original


@pytest.mark.parametrize("values_file", CI_FILES)
def test_ci_values_render(renderer: Renderer, values_file: str) -> None:
    docs = renderer.ci(values_file)
    assert docs, "nothing rendered"
    kinds = {d["kind"] for d in docs}
    assert kinds & WORKLOAD_KINDS
    assert {"Service", "ServiceAccount", "Role", "RoleBinding"} <= kinds
    for d in docs:
        assert d["metadata"]["name"], d
        assert d["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names)), "duplicate objects"


def test_ci_scenarios_are_present() -> None:
    """The scenarios named in the issue each have a values file."""
    for scenario in (
        "default",
        "burstable",
        "dra-claim",
        "dra-extended",
        "resizer",
        "pod-level-resources",
        "monitoring",
        "multi-replica",
        "replicas-gateway",
        "autoscaling",
    ):
        assert f"{scenario}-values.yaml" in CI_FILES


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("values_file", CI_FILES)
def test_rendered_objects_pass_kubernetes_validate_strict(
    renderer: Renderer,
    cached_validator: Callable[[Obj, str], None],
    values_file: str,
    version: str,
) -> None:
    for d in renderer.ci(values_file):
        if d["kind"] in CRD_KINDS:
            continue
        try:
            cached_validator(d, version)
        except kv.ValidationError as e:  # pragma: no cover - failure path
            pytest.fail(
                f"{d['kind']}/{d['metadata']['name']} invalid for {version}: "
                f"{e.message} at {list(e.path)}"
            )


@pytest.mark.timeout(300)  # three CLI runs over every scenario; slow on a loaded 2-core VM
def test_kubernetes_validate_cli_strict(renderer: Renderer, tmp_path: Path) -> None:
    """The same check through the kubernetes-validate CLI: all scenarios, one call per version,
    the three versions at once."""
    files = []
    for name in CI_FILES:
        docs = [d for d in renderer.ci(name) if d["kind"] not in CRD_KINDS]
        path = tmp_path / name
        path.write_text(yaml.safe_dump_all(docs))
        files.append(str(path))
    cli = (sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet")
    procs = {
        version: subprocess.Popen(
            [*cli, "-k", version, *files],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for version in K8S_VERSIONS
    }
    try:
        for version, proc in procs.items():
            out, _ = proc.communicate(timeout=280)
            assert proc.returncode == 0, f"{version}: {out}"
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.parametrize("kube_version", ["v" + v for v in K8S_VERSIONS])
def test_helm_lint_clean(kube_version: str) -> None:
    report = helm.lint(str(CHART), strict=True, kube_version=kube_version, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


@pytest.mark.parametrize("values_file", CI_FILES)
def test_helm_lint_clean_per_scenario(values_file: str) -> None:
    report = helm.lint(
        str(CHART),
        load_values(values_file),
        strict=True,
        kube_version="v1.36.0",
        namespace=NAMESPACE,
    )
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


def test_vendored_crd_schemas_are_loaded() -> None:
    assert set(crd_validators()) == {
        ("gateway.networking.k8s.io/v1", "Gateway"),
        ("gateway.networking.k8s.io/v1", "HTTPRoute"),
        ("gateway.networking.k8s.io/v1", "GRPCRoute"),
        ("monitoring.coreos.com/v1", "PrometheusRule"),
        ("gateway.envoyproxy.io/v1alpha1", "BackendTrafficPolicy"),
    }
    # The strict form does catch a misspelt field.
    route = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {}}
    route["spec"] = {"parentRef": [{"name": "gw"}]}
    validator = crd_validators()[("gateway.networking.k8s.io/v1", "HTTPRoute")]
    assert list(validator.iter_errors(route))


@pytest.mark.parametrize("values_file", CI_FILES)
def test_custom_resources_match_their_crd_schemas(renderer: Renderer, values_file: str) -> None:
    for d in renderer.ci(values_file):
        validator = crd_validators().get((d["apiVersion"], d["kind"]))
        if validator is None:
            assert d["kind"] not in CRD_KINDS - {"ServiceMonitor", "VerticalPodAutoscaler"}, d
            continue
        errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(d)]
        assert not errors, f"{d['kind']}/{d['metadata']['name']}: {errors}"
