"""crds/ is exactly what the models generate, and the chart uses it (no copy)."""

from __future__ import annotations

from pathlib import Path

import yaml

from headrace_operator import crdgen

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"
CHART_CRDS = ROOT / "charts" / "headrace-operator" / "crds"
FIX = "python -m headrace_operator.crdgen --out crds"


def test_committed_crds_match_the_models() -> None:
    fresh = crdgen.generate()
    on_disk = {p.name: p.read_text() for p in CRDS.glob("*.yaml")}
    assert sorted(on_disk) == sorted(fresh), f"{CRDS}: files differ; run {FIX}"
    for name, text in fresh.items():
        assert on_disk[name] == text, f"{CRDS / name} is stale; run {FIX}"


def test_the_chart_uses_crds_itself_not_a_copy() -> None:
    assert CHART_CRDS.is_symlink(), f"{CHART_CRDS} must be a link to {CRDS}, not a copy"
    assert CHART_CRDS.resolve() == CRDS.resolve()


def test_crdgen_writes_what_generate_returns(tmp_path: Path) -> None:
    assert crdgen.main(["--out", str(tmp_path)]) == 0
    written = {p.name: p.read_text() for p in tmp_path.glob("*.yaml")}
    assert written == crdgen.generate()


def test_generated_schemas_are_structural() -> None:
    """No $ref, anyOf or null defaults survive (the API server refuses them)."""

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            assert "$ref" not in node and "anyOf" not in node, path
            assert "additionalProperties" not in node or isinstance(
                node["additionalProperties"], dict
            ), path
            if "default" in node:
                assert node["default"] is not None, path
            if "properties" in node:
                assert node.get("type") == "object", path
            for key, value in node.items():
                walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for index, item in enumerate(node):
                walk(item, f"{path}[{index}]")

    for name, text in crdgen.generate().items():
        crd = yaml.safe_load(text)
        version = crd["spec"]["versions"][0]
        walk(version["schema"]["openAPIV3Schema"], name)
        assert version["subresources"]["status"] == {}


def test_printer_columns() -> None:
    clusters = crdgen.crd("StreamingCluster")["spec"]["versions"][0]
    columns = {c["name"]: c["jsonPath"] for c in clusters["additionalPrinterColumns"]}
    assert columns["Nodes"] == ".status.nodeSummary"
    assert columns["PChannels"] == ".status.pchannelSummary"
    assert columns["WAL"] == ".spec.wal.backend"
    assert columns["Version"] == ".status.runningVersion"
    assert columns["Image"] == ".status.runningImage"
    assert columns["Spec-Version"] == ".spec.version"
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    assignments = crdgen.crd("PChannelAssignment")["spec"]["versions"][0]
    names = [c["name"] for c in assignments["additionalPrinterColumns"]]
    assert names[:5] == ["Cluster", "PChannel", "Node", "Term", "State"]


def test_no_schema_uses_a_numeric_exclusive_bound() -> None:
    """Kubernetes' OpenAPI v3 schemas take exclusiveMinimum/Maximum as booleans
    beside minimum/maximum; pydantic's gt/lt write JSON Schema's numbers, which
    the API server refuses when the CRD is applied (this once broke every test
    that installs the CRDs)."""

    def numeric_bounds(node: object, path: str) -> list[str]:
        found: list[str] = []
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
                    found.append(f"{path}.{key}")
                found += numeric_bounds(value, f"{path}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                found += numeric_bounds(value, f"{path}[{i}]")
        return found

    for name, text in crdgen.generate().items():
        assert numeric_bounds(yaml.safe_load(text), name) == []
