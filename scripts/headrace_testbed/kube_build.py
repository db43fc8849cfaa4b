"""Build kube-apiserver and kube-controller-manager from the Go module proxy.

The wrapper module in ``scripts/testbed/kube`` requires ``k8s.io/kubernetes``
at :data:`KUBE_VERSION`. That module's own ``go.mod`` points every staging
module (``k8s.io/api``, ``k8s.io/client-go``, ...) at ``./staging/src/...``,
which does not exist in the proxy's copy, so the wrapper replaces each of them
with the published ``v0.<minor>.<patch>`` release. :func:`render_go_mod`
produces that ``go.mod`` from the upstream one; ``python -m
headrace_testbed.kube regen`` rewrites the module (and ``go mod tidy`` its
``go.sum``) after a change of :data:`KUBE_VERSION`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

from headrace_testbed import TestbedError, gobuild
from headrace_testbed.cache import bin_dir, file_lock

KUBE_VERSION = "v1.34.4"
SOURCE_DIR = Path(__file__).resolve().parents[1] / "testbed" / "kube"
MODULE_PATH = "headrace.local/testbed/kube"
BINARIES = ("kube-apiserver", "kube-controller-manager")
# kube-scheduler stays in tools.go so that go.sum covers it too.
TOOL_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
BUILD_TIMEOUT_S = 3600.0
_STAGING = re.compile(
    r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/src/k8s\.io/[\w.-]+\s*$", re.MULTILINE
)
_GO_DIRECTIVE = re.compile(r"^go\s+(\S+)\s*$", re.MULTILINE)
_REPLACE_LINE = re.compile(r"^\s*(?:replace\s+)?(\S+)\s+=>\s+(\S+)(?:\s+(\S+))?\s*$")


def staging_version(kube_version: str) -> str:
    """The staging modules' tag for a Kubernetes release: ``v1.34.4`` -> ``v0.34.4``."""
    match = re.fullmatch(r"v1\.(\d+)\.(\d+)", kube_version)
    if match is None:
        raise TestbedError(f"unsupported Kubernetes version {kube_version!r} (want v1.MINOR.PATCH)")
    return f"v0.{match.group(1)}.{match.group(2)}"


def staging_modules(upstream_go_mod: str) -> list[str]:
    """Modules that ``k8s.io/kubernetes``'s go.mod maps to its ``staging/`` tree, sorted."""
    modules = sorted(set(_STAGING.findall(upstream_go_mod)))
    if not modules:
        raise TestbedError("the k8s.io/kubernetes go.mod names no staging modules")
    return modules


def render_replacements(upstream_go_mod: str, kube_version: str) -> dict[str, str]:
    """``module -> "module version"`` for every staging module."""
    tag = staging_version(kube_version)
    return {module: f"{module} {tag}" for module in staging_modules(upstream_go_mod)}


def render_go_mod(upstream_go_mod: str, kube_version: str) -> str:
    """The wrapper's go.mod before ``go mod tidy`` adds the indirect requirements."""
    go = _GO_DIRECTIVE.search(upstream_go_mod)
    if go is None:
        raise TestbedError("the k8s.io/kubernetes go.mod has no go directive")
    lines = [f"module {MODULE_PATH}", "", f"go {go.group(1)}", ""]
    lines += [f"require k8s.io/kubernetes {kube_version}", "", "replace ("]
    lines += [
        f"\t{m} => {t}" for m, t in render_replacements(upstream_go_mod, kube_version).items()
    ]
    lines += [")", ""]
    return "\n".join(lines)


def render_tools_go() -> str:
    imports = "\n".join(f'\t_ "k8s.io/kubernetes/cmd/{name}"' for name in TOOL_COMMANDS)
    return (
        "//go:build tools\n\n"
        "// Package tools pins the Kubernetes commands the test bed builds with\n"
        "// `go build k8s.io/kubernetes/cmd/<name>` in this directory.\n"
        f"package tools\n\nimport (\n{imports}\n)\n"
    )


def parse_replacements(go_mod: str) -> dict[str, str]:
    """The ``replace`` directives of a go.mod as ``old -> "new [version]"``."""
    found: dict[str, str] = {}
    in_block = False
    for raw in go_mod.splitlines():
        line = raw.split("//", 1)[0].rstrip()
        if line.startswith("replace ("):
            in_block = True
            continue
        if in_block and line.strip() == ")":
            in_block = False
            continue
        if in_block or line.startswith("replace "):
            match = _REPLACE_LINE.match(line)
            if match:
                found[match.group(1)] = " ".join(g for g in match.groups()[1:] if g)
    return found


def required_kube_version(source_dir: Path = SOURCE_DIR) -> str:
    return gobuild.required_version(source_dir, "k8s.io/kubernetes")


def run_go(args: list[str], cwd: Path, timeout: float) -> str:
    """Run ``go ARGS`` in ``cwd`` (module mode); its stdout, or TestbedError with the output."""
    env = dict(os.environ, GOFLAGS="-mod=mod")
    go = gobuild.go_binary(
        "Go >= 1.24 (>= 1.26 for Helm) is needed once to build the Kubernetes test bed; "
        "or deselect those tests with -m 'not kube'"
    )
    command = [go, *args]
    try:
        result = subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise TestbedError(f"`{' '.join(command)}` took more than {timeout:.0f} s") from exc
    if result.returncode != 0:
        tail = (result.stderr or result.stdout)[-4000:]
        raise TestbedError(
            f"`{' '.join(command)}` in {cwd} failed (exit {result.returncode}):\n{tail}"
        )
    return result.stdout


def upstream_go_mod(kube_version: str = KUBE_VERSION) -> str:
    """Text of ``k8s.io/kubernetes@<version>``'s go.mod, fetched through the module proxy."""
    with tempfile.TemporaryDirectory(prefix="headrace-gomod-") as scratch:
        out = run_go(
            ["mod", "download", "-json", f"k8s.io/kubernetes@{kube_version}"], Path(scratch), 900
        )
    try:
        return Path(json.loads(out)["GoMod"]).read_text()
    except (ValueError, KeyError, OSError) as exc:
        raise TestbedError(
            f"cannot read the k8s.io/kubernetes {kube_version} go.mod: {exc}"
        ) from exc


def regenerate_module(kube_version: str = KUBE_VERSION, source_dir: Path = SOURCE_DIR) -> None:
    """Rewrite the wrapper module for ``kube_version`` and tidy its go.sum."""
    upstream = upstream_go_mod(kube_version)
    source_dir.mkdir(parents=True, exist_ok=True)
    (source_dir / "go.mod").write_text(render_go_mod(upstream, kube_version))
    (source_dir / "tools.go").write_text(render_tools_go())
    run_go(["mod", "tidy", "-e"], source_dir, BUILD_TIMEOUT_S)


def version_ldflags(kube_version: str) -> str:
    minor = kube_version.split(".")[1]
    package = "k8s.io/component-base/version"
    return (
        f"-X {package}.gitVersion={kube_version} -X {package}.gitMajor=1 "
        f"-X {package}.gitMinor={minor} -X {package}.gitTreeState=clean"
    )


def _build(name: str, target: Path, source_dir: Path, kube_version: str) -> None:
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    package = f"k8s.io/kubernetes/cmd/{name}"
    try:
        run_go(
            ["build", "-ldflags", version_ldflags(kube_version), "-o", str(partial), package],
            source_dir,
            BUILD_TIMEOUT_S,
        )
        if not partial.exists():
            raise TestbedError(f"`go build {package}` produced no binary")
        partial.chmod(0o755)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def ensure_kube_binaries(source_dir: Path = SOURCE_DIR) -> dict[str, Path]:
    """Paths of the cached kube-apiserver and kube-controller-manager, built on first use.

    ``HEADRACE_KUBE_BIN_DIR`` names a directory that already holds both.
    """
    override = os.environ.get("HEADRACE_KUBE_BIN_DIR")
    if override:
        found = {name: Path(override) / name for name in BINARIES}
        missing = [str(p) for p in found.values() if not os.access(p, os.X_OK)]
        if missing:
            raise TestbedError(f"HEADRACE_KUBE_BIN_DIR={override} lacks {', '.join(missing)}")
        return found
    version = required_kube_version(source_dir)
    if version != KUBE_VERSION:
        raise TestbedError(
            f"{source_dir / 'go.mod'} requires k8s.io/kubernetes {version} but KUBE_VERSION is "
            f"{KUBE_VERSION}: run `PYTHONPATH=scripts python -m headrace_testbed.kube regen`"
        )
    paths: dict[str, Path] = {}
    for name in BINARIES:
        target = bin_dir() / f"{name}-{version}"
        if not os.access(target, os.X_OK):
            with file_lock(target.with_name(f"{target.name}.lock")):
                if not os.access(target, os.X_OK):
                    _build(name, target, source_dir, version)
        paths[name] = target
    return paths


def module_drift(source_dir: Path = SOURCE_DIR) -> list[str]:
    """How the committed wrapper module differs from what :func:`regenerate_module` writes."""
    problems: list[str] = []
    required = required_kube_version(source_dir)
    if required != KUBE_VERSION:
        problems.append(
            f"go.mod requires k8s.io/kubernetes {required}, KUBE_VERSION is {KUBE_VERSION}"
        )
    expected = render_replacements(upstream_go_mod(KUBE_VERSION), KUBE_VERSION)
    actual = parse_replacements((source_dir / "go.mod").read_text())
    if actual != expected:
        wrong = sorted(set(expected.items()) ^ set(actual.items()))
        problems.append(f"go.mod replace block differs from the generated one: {wrong}")
    if (source_dir / "tools.go").read_text() != render_tools_go():
        problems.append("tools.go differs from the generated one")
    try:
        run_go(["mod", "tidy", "-diff"], source_dir, 900)
    except TestbedError as exc:
        problems.append(f"go.mod/go.sum are not tidy: {exc}")
    return problems
