"""The Helm CLI for the chart tests, built from the Go module proxy once and cached.

``ensure_helm()`` builds ``helm.sh/helm/v3/cmd/helm`` in the wrapper module
``scripts/testbed/helm`` (its ``go.mod`` pins the version) into
``<cache>/bin/helm-<version>``. :class:`Helm` runs it against one kubeconfig
with its own config, cache and data directories, so nothing outside the test's
directory is read or written.

Command line::

    PYTHONPATH=scripts python -m headrace_testbed.helm build   # print the path
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

from headrace_testbed import TestbedError, gobuild
from headrace_testbed.cache import bin_dir, file_lock
from headrace_testbed.kube_build import run_go

SOURCE_DIR = Path(__file__).resolve().parents[1] / "testbed" / "helm"
BUILD_TIMEOUT_S = 3600.0
RUN_TIMEOUT_S = 300.0


def helm_version(source_dir: Path = SOURCE_DIR) -> str:
    """The Helm release the wrapper module requires, e.g. ``v3.22.0``."""
    return gobuild.required_version(source_dir, "helm.sh/helm/v3")


def _build(target: Path, source_dir: Path, version: str) -> None:
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    ldflags = f"-X helm.sh/helm/v3/internal/version.version={version}"
    try:
        run_go(
            ["build", "-ldflags", ldflags, "-o", str(partial), "helm.sh/helm/v3/cmd/helm"],
            source_dir,
            BUILD_TIMEOUT_S,
        )
        if not partial.exists():
            raise TestbedError("`go build helm.sh/helm/v3/cmd/helm` produced no binary")
        partial.chmod(0o755)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def module_drift(source_dir: Path = SOURCE_DIR) -> list[str]:
    """Problems of the committed wrapper module (go.mod/go.sum not tidy)."""
    try:
        run_go(["mod", "tidy", "-diff"], source_dir, 900)
    except TestbedError as exc:
        return [f"go.mod/go.sum are not tidy: {exc}"]
    return []


def ensure_helm(source_dir: Path = SOURCE_DIR) -> Path:
    """Path of the cached helm binary (``HEADRACE_HELM_BIN`` overrides), built on first use."""
    override = os.environ.get("HEADRACE_HELM_BIN")
    if override:
        if not os.access(override, os.X_OK):
            raise TestbedError(f"HEADRACE_HELM_BIN={override} is not an executable file")
        return Path(override)
    version = helm_version(source_dir)
    target = bin_dir() / f"helm-{version}"
    if not os.access(target, os.X_OK):
        with file_lock(target.with_name(f"{target.name}.lock")):
            if not os.access(target, os.X_OK):
                _build(target, source_dir, version)
    return target


@dataclasses.dataclass(frozen=True)
class Helm:
    """``helm`` bound to one kubeconfig, with its state under ``home``."""

    binary: Path
    kubeconfig: Path
    home: Path

    def env(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith("HELM_")}
        env.update(
            KUBECONFIG=str(self.kubeconfig),
            HELM_CONFIG_HOME=str(self.home / "config"),
            HELM_CACHE_HOME=str(self.home / "cache"),
            HELM_DATA_HOME=str(self.home / "data"),
        )
        return env

    def run(self, *args: str, timeout: float = RUN_TIMEOUT_S) -> str:
        """Run ``helm ARGS``; its standard output, or TestbedError with its output."""
        command = [str(self.binary), *args]
        try:
            result = subprocess.run(
                command,
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise TestbedError(f"`helm {' '.join(args)}` took more than {timeout:.0f} s") from exc
        if result.returncode != 0:
            raise TestbedError(
                f"`helm {' '.join(args)}` failed ({result.returncode}):\n"
                f"{result.stderr[-4000:]}{result.stdout[-2000:]}"
            )
        return result.stdout


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["build"]:
        print("usage: python -m headrace_testbed.helm build", file=sys.stderr)
        return 2
    print(ensure_helm())
    return 0


if __name__ == "__main__":
    sys.exit(main())
