"""One pod run as local processes: init containers, restarts, probes, termination, status."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import datetime
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from headrace_testbed.kubelet_probe import ProbeState, ProbeTarget
from headrace_testbed.kubelet_spec import (
    ContainerView,
    EnvContext,
    Lookup,
    Obj,
    SpecError,
    condition,
    container_argv,
    container_env,
    mounts,
    pod_phase,
    pull_failure,
    readiness_gates_pass,
    rewrite_paths,
    volume_dirs,
    volume_files,
)

# Seconds a container must run before its restart back-off starts over.
_BACKOFF_RESET_S = 10.0


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass
class Runtime:
    """What every pod worker shares: where to put files and how to start processes."""

    root: Path
    node_ip: str
    base_env: Mapping[str, str]
    entrypoint: Callable[[str], Sequence[str] | None]
    lookup: Lookup
    executor: concurrent.futures.Executor
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 10.0


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


@dataclasses.dataclass
class ContainerRun:
    """One container of a pod, across its restarts."""

    spec: Obj
    init: bool
    backoff_s: float
    process: subprocess.Popen[bytes] | None = None
    restart_count: int = 0
    started_once: bool = False
    started_at: str = ""
    started_mono: float = 0.0
    exit_code: int | None = None
    last_state: Obj | None = None
    terminated: Obj | None = None
    waiting: tuple[str, str] = ("ContainerCreating", "")
    next_start: float = 0.0
    pull_attempts: int = 0
    kill_at: float | None = None
    probes: dict[str, ProbeState] = dataclasses.field(default_factory=dict)
    target: ProbeTarget | None = None

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def running(self) -> bool:
        return self.process is not None

    @property
    def started(self) -> bool:
        startup = self.probes.get("startupProbe")
        return self.running and (startup is None or startup.result)

    @property
    def ready(self) -> bool:
        readiness = self.probes.get("readinessProbe")
        return self.started and (readiness is None or readiness.result)

    def view(self) -> ContainerView:
        return ContainerView(self.started_once, self.running, self.exit_code)

    def signal(self, sig: int) -> None:
        if self.process is not None:
            _signal_group(self.process, sig)

    def reap(self, now: float) -> bool:
        """Record an exit; True if the process had exited."""
        if self.process is None or self.process.poll() is None:
            return False
        code = self.process.returncode
        self.exit_code = 128 - code if code < 0 else code
        self.terminated = {
            "exitCode": self.exit_code,
            "reason": "Completed" if self.exit_code == 0 else "Error",
            "startedAt": self.started_at,
            "finishedAt": now_rfc3339(),
            "containerID": f"headrace://{self.process.pid}",
        }
        _signal_group(self.process, signal.SIGKILL)  # leftovers of the container's group
        self.process = None
        self.kill_at = None
        self.probes.clear()
        if now - self.started_mono >= _BACKOFF_RESET_S:
            self.backoff_s = 0.0
        return True

    def state(self) -> tuple[Obj, Obj]:
        """``(state, lastState)`` as a container status reports them."""
        if self.process is not None:
            current: Obj = {"running": {"startedAt": self.started_at}}
        elif self.terminated is not None and self.next_start == float("inf"):
            current = {"terminated": self.terminated}
        else:
            reason, message = self.waiting
            current = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        last = {"terminated": self.last_state} if self.last_state else {}
        return current, last


class PodWorker:
    """Drives one pod's containers; :meth:`sync` advances it, :meth:`status` reports it."""

    def __init__(self, pod: Obj, pod_ip: str, runtime: Runtime) -> None:
        self.pod = pod
        self.pod_ip = pod_ip
        self.rt = runtime
        meta = pod["metadata"]
        self.dir = runtime.root / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        spec = pod["spec"]
        self.init = [ContainerRun(c, True, 0.0) for c in spec.get("initContainers") or []]
        self.main = [ContainerRun(c, False, 0.0) for c in spec.get("containers") or []]
        if self.init:
            for run in self.main:
                run.waiting = ("PodInitializing", "")
        self.prepared = False
        self.prepare_after = 0.0
        self.terminating = False
        self.start_time = now_rfc3339()
        self.transitions: dict[str, tuple[bool, str]] = {}
        self.volume_dirs: dict[str, Path] = {}

    @property
    def restart_policy(self) -> str:
        return str(self.pod["spec"].get("restartPolicy") or "Always")

    @property
    def containers(self) -> list[ContainerRun]:
        return [*self.init, *self.main]

    def log_path(self, container: str) -> Path:
        return self.dir / "logs" / f"{container}.log"

    def _prepare(self) -> None:
        namespace = self.pod["metadata"]["namespace"]
        self.volume_dirs = volume_dirs(self.pod, self.dir, self.rt.root / "pvc")
        volumes = {v["name"]: v for v in self.pod["spec"].get("volumes") or []}
        for name, local in self.volume_dirs.items():
            local.mkdir(parents=True, exist_ok=True)
            files = volume_files(volumes[name], namespace, self.rt.lookup)
            for relative, content in (files or {}).items():
                path = local / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content)
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        self.prepared = True

    def _start(self, run: ContainerRun, now: float) -> None:
        spec = run.spec
        base = dict(self.rt.base_env)
        meta = self.pod["metadata"]
        base.update(POD_IP=self.pod_ip, HOSTNAME=self.pod["spec"].get("hostname") or meta["name"])
        env = container_env(
            EnvContext(self.pod, self.pod_ip, self.rt.node_ip, self.rt.lookup), spec, base
        )
        mount_list = mounts(spec, self.volume_dirs)
        image = str(spec.get("image", ""))
        argv = container_argv(spec, env, None if spec.get("command") else self.rt.entrypoint(image))
        argv = [rewrite_paths(arg, mount_list) for arg in argv]
        env = {key: rewrite_paths(value, mount_list) for key, value in env.items()}
        rootfs = self.dir / "rootfs" / run.name
        working = spec.get("workingDir") or ""
        cwd = Path(rewrite_paths(working, mount_list)) if working else rootfs
        if working and str(cwd) == working:
            cwd = rootfs / working.lstrip("/")
        cwd.mkdir(parents=True, exist_ok=True)
        env.setdefault("HOME", str(rootfs))
        executable = shutil.which(argv[0], path=env.get("PATH"))
        if executable is None:
            raise SpecError("RunContainerError", f"{argv[0]!r} is not an executable on PATH")
        with self.log_path(run.name).open("ab") as log:
            run.process = subprocess.Popen(
                [executable, *argv[1:]],
                cwd=cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        if run.started_once:
            run.restart_count += 1
            run.last_state = run.terminated
        run.started_once = True
        run.started_at = now_rfc3339()
        run.started_mono = now
        run.exit_code = None
        run.terminated = None
        ports = {
            p["name"]: int(p["containerPort"]) for p in spec.get("ports") or [] if p.get("name")
        }
        run.target = ProbeTarget(self.pod_ip, ports, env, cwd)
        initial = {"startupProbe": False, "livenessProbe": True, "readinessProbe": False}
        run.probes = {}
        for kind, result in initial.items():
            probe = spec.get(kind)
            if probe and "exec" in probe:
                command = [
                    rewrite_paths(arg, mount_list) for arg in probe["exec"].get("command", [])
                ]
                probe = {**probe, "exec": {"command": command}}
            if probe:
                run.probes[kind] = ProbeState(probe, result, now)

    def _pulled(self, run: ContainerRun, now: float) -> bool:
        """Whether the container's image counts as present; if not, its waiting
        state says why and the next attempt is backed off (1 s doubling to the
        runtime's maximum)."""
        refused = pull_failure(str(run.spec.get("image", "")), run.pull_attempts + 1)
        if refused is None:
            return True
        run.pull_attempts += 1
        run.waiting = refused
        delay = self.rt.backoff_initial_s * 2 ** (run.pull_attempts - 1)
        run.next_start = now + min(delay, self.rt.backoff_max_s)
        return False

    def _try_start(self, run: ContainerRun, now: float) -> None:
        if now < run.next_start or not self._pulled(run, now):
            return
        try:
            self._start(run, now)
        except SpecError as exc:
            run.waiting = (exc.reason, str(exc))
            run.next_start = now + self.rt.backoff_max_s
        except OSError as exc:
            run.waiting = ("RunContainerError", str(exc))
            run.next_start = now + self.rt.backoff_max_s

    def _after_exit(self, run: ContainerRun, now: float) -> None:
        policy = self.restart_policy
        restart = policy == "Always" or (policy == "OnFailure" and run.exit_code != 0)
        if run.init:
            restart = run.exit_code != 0 and policy != "Never"
        if not restart:
            run.next_start = float("inf")
            return
        run.backoff_s = min(
            max(run.backoff_s * 2, self.rt.backoff_initial_s), self.rt.backoff_max_s
        )
        run.next_start = now + run.backoff_s
        run.waiting = ("CrashLoopBackOff", f"back-off {run.backoff_s:.0f}s restarting {run.name}")

    def _probe(self, run: ContainerRun, now: float) -> None:
        if run.target is None:
            return
        startup = run.probes.get("startupProbe")
        if startup is not None and not startup.result:
            startup.poll(now, self.rt.executor, run.target)
            return
        for kind in ("livenessProbe", "readinessProbe"):
            probe = run.probes.get(kind)
            if probe is not None:
                probe.poll(now, self.rt.executor, run.target)
        liveness = run.probes.get("livenessProbe")
        if liveness is not None and not liveness.result and run.kill_at is None:
            self._terminate(
                run, now, self._grace(liveness.spec.get("terminationGracePeriodSeconds"))
            )

    def _grace(self, override: object = None) -> float:
        value = (
            override
            if override is not None
            else self.pod["spec"].get("terminationGracePeriodSeconds")
        )
        return float(value) if isinstance(value, int | float) else 30.0

    def _terminate(self, run: ContainerRun, now: float, grace: float) -> None:
        run.signal(signal.SIGTERM)
        run.kill_at = now + grace

    def init_done(self) -> bool:
        return all(run.exit_code == 0 and not run.running for run in self.init)

    def sync(self, now: float) -> None:
        """Advance the pod one step: reap, restart, start the next container, probe."""
        for run in self.containers:
            if run.reap(now):
                if not self.terminating:
                    self._after_exit(run, now)
            elif run.kill_at is not None and now >= run.kill_at:
                run.signal(signal.SIGKILL)
        if self.terminating or now < self.prepare_after:
            return
        if not self.prepared:
            try:
                self._prepare()
            except SpecError as exc:
                for run in self.containers:
                    run.waiting = (exc.reason, str(exc))
                self.prepare_after = now + self.rt.backoff_max_s
                return
        if self.pod_phase() in ("Succeeded", "Failed"):
            return
        for run in self.init:
            if run.exit_code == 0 and not run.running:
                continue
            if not run.running:
                self._try_start(run, now)
            return
        for run in self.main:
            if run.running:
                self._probe(run, now)
            elif run.next_start != float("inf"):
                self._try_start(run, now)

    def pod_phase(self) -> str:
        views = ([c.view() for c in self.init], [c.view() for c in self.main])
        return pod_phase(self.restart_policy, *views, init_done=self.init_done())

    def begin_termination(self, grace: float | None) -> None:
        """SIGTERM every container; SIGKILL what is left after ``grace`` seconds."""
        if self.terminating:
            return
        self.terminating = True
        now = time.monotonic()
        seconds = self._grace() if grace is None else grace
        for run in self.containers:
            run.next_start = float("inf")
            if run.running:
                self._terminate(run, now, seconds)

    def stopped(self) -> bool:
        return not any(run.running for run in self.containers)

    def _condition(self, kind: str, value: bool, reason: str = "") -> Obj:
        previous = self.transitions.get(kind)
        if previous is None or previous[0] != value:
            self.transitions[kind] = (value, now_rfc3339())
        return condition(kind, value, self.transitions[kind][1], reason)

    def status(self, node_ip: str) -> Obj:
        containers_ready = bool(self.main) and all(run.ready for run in self.main)
        initialized = self.init_done()
        statuses: dict[str, list[Obj]] = {"initContainerStatuses": [], "containerStatuses": []}
        for run in self.containers:
            state, last = run.state()
            entry: Obj = {
                "name": run.name,
                "image": run.spec.get("image", ""),
                "imageID": "",
                "ready": run.ready,
                "started": run.started,
                "restartCount": run.restart_count,
                "state": state,
                "lastState": last,
            }
            if run.process is not None:
                entry["containerID"] = f"headrace://{run.process.pid}"
            statuses["initContainerStatuses" if run.init else "containerStatuses"].append(entry)
        return {
            "phase": self.pod_phase(),
            "hostIP": node_ip,
            "hostIPs": [{"ip": node_ip}],
            "podIP": self.pod_ip,
            "podIPs": [{"ip": self.pod_ip}],
            "startTime": self.start_time,
            "conditions": [
                self._condition("PodScheduled", True),
                self._condition("Initialized", initialized),
                self._condition("ContainersReady", containers_ready),
                self._condition("Ready", containers_ready and readiness_gates_pass(self.pod)),
            ],
            **statuses,
        }
