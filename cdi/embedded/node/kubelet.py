"""The kubelet of the local node: one worker per pod bound to this node, which sets up the pod's
IP and volumes, runs its init containers then its containers as sandboxed processes, restarts them
by `restartPolicy` with the kubelet's back-off, probes them, reports every state change in the
pod's status, and on deletion stops them (SIGTERM, SIGKILL after the grace period) before removing
the pod for good."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdi.api.groups import CONFIGMAPS, PODS, PVCS, PVS, SECRETS
from cdi.common.backoff import backoff_delay
from cdi.common.tlsfront import NO_EXTENSIONS_ENV
from cdi.embedded.control import LocalApi
from cdi.embedded.kubeapi.errors import StatusError
from cdi.embedded.node.environment import ConfigError, build_env, expand_args
from cdi.embedded.node.images import ImagePullError, entrypoint, is_oci_image, oci_argv
from cdi.embedded.node.logs import TERMINATED, ContainerLogs, NodeLogs, keep_terminated, tail_text
from cdi.embedded.node.oci import ImageStore, PulledImage, PullError, image_group, image_passwd
from cdi.embedded.node.podips import PodIPs
from cdi.embedded.node.podstatus import carry_transition_times, now, pod_conditions, pod_phase
from cdi.embedded.node.probes import Prober, ProbeResult
from cdi.embedded.node.process import ContainerProcess
from cdi.embedded.node.sandbox import (
    HELPER_DIR,
    Mount,
    SandboxSpec,
    container_capabilities,
    helper_setpriv,
    inside_image,
    system_path,
    user_argv,
)
from cdi.embedded.node.security import Identity, ImageUsers, RuntimeRefused, identity
from cdi.embedded.node.userns import open_user_namespace
from cdi.embedded.node.volumes import PodVolumes, Published, VolumeError, own_device

log = logging.getLogger(__name__)

Obj = dict[str, Any]
HOST_IP = "127.0.0.1"
TERMINATION_MESSAGE_LIMIT = 4096
RETRY_PERIOD = 2.0


@dataclass
class KubeletConfig:
    node_name: str
    root: Path                      # the node's directory (pods/<uid>/... below it)
    hide: list[Path] = field(default_factory=list)  # host paths pods must not see (cdi up's data dir)
    restart_backoff: float = 10.0   # first CrashLoopBackOff delay; doubles up to max_backoff
    max_backoff: float = 300.0
    shutdown_grace: float = 5.0     # grace of containers still running when `cdi up` stops
    bwrap: str = "bwrap"
    setpriv: str = "setpriv"
    python: str = sys.executable
    package_root: Path = Path(__file__).resolve().parents[3]
    userns_fd: int | None = None    # the node's user namespace, opened when the kubelet starts
    insecure_registries: list[str] = field(default_factory=list)  # pulled without TLS verification
    _helpers: list[Mount] | None = None

    def helpers(self) -> list[Mount]:
        """setpriv, its libraries and the dynamic loader (as `ldd` lists them), for containers of pulled
        images, which may have none of them: bound read-only in HELPER_DIR."""
        if self._helpers is None:
            program = shutil.which(self.setpriv) or self.setpriv
            found = [Mount(Path(program), f"{HELPER_DIR}/setpriv", read_only=True)]
            listing = subprocess.run(["ldd", program], capture_output=True, text=True, check=False).stdout
            for line in listing.splitlines():
                words = line.split()
                path = words[2] if len(words) >= 3 and words[1] == "=>" else (words[0] if words else "")
                if path.startswith("/") and Path(path).exists():
                    found.append(Mount(Path(path).resolve(), f"{HELPER_DIR}/{Path(path).name}", read_only=True))
            self._helpers = found
        return self._helpers

    def runtime_mounts(self) -> list[Mount]:
        """What the "image" runs from besides the system directories: this Python's installation, its
        virtualenv and this package, read-only at the same paths, so that `python -m cdi.importer` works
        while nothing else of the trees they live in (a working tree, a home directory) is there."""
        package = Path(__file__).resolve().parents[2]
        candidates = {package, Path(sys.prefix), Path(sys.exec_prefix), Path(sys.base_prefix),
                      Path(sys.base_exec_prefix), Path(self.python).parent}
        paths = sorted(p for p in candidates if p.is_absolute() and p.is_dir() and not system_path(str(p)))
        kept: list[Path] = []
        for path in paths:  # sorted: a path comes after the ones it lies in
            if not any(path == k or k in path.parents for k in kept):
                kept.append(path)
        return [Mount(path, str(path), read_only=True) for path in kept]

    def base_env(self, pod: Obj, identity: Identity) -> dict[str, str]:
        """What the "image" provides: PATH with this Python first, PYTHONPATH to this package, HOME of
        the container's user; `CDI_NO_EXTENSIONS` as `cdi up` has it (the "image" built without C
        extensions, so that the whole suite can run that way)."""
        bindir = str(Path(self.python).parent)
        env = {"PATH": f"{bindir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOSTNAME": pod["metadata"]["name"], "HOME": identity.home, "LANG": "C.UTF-8",
               "PYTHONPATH": str(self.package_root), "PYTHONUNBUFFERED": "1"}
        if os.environ.get(NO_EXTENSIONS_ENV):
            env[NO_EXTENSIONS_ENV] = os.environ[NO_EXTENSIONS_ENV]
        return env


def _terminated_reason(code: int) -> str:
    return "Completed" if code == 0 else "Error"


class ContainerRunner:
    """The life of one container of a pod across its restarts."""

    def __init__(self, worker: PodWorker, spec: Obj, init: bool, previous: Obj | None) -> None:
        self.worker = worker
        self.spec = spec
        self.name: str = spec["name"]
        self.init = init
        self.dir = worker.dir / "containers" / self.name
        self.restart_count = int((previous or {}).get("restartCount") or 0)
        self.last_state: Obj = dict((previous or {}).get("lastState") or {})
        self.state: Obj = {"waiting": {"reason": "ContainerCreating"}}
        self.ready = False
        self.started = False
        self.container_id = ""
        self.process: ContainerProcess | None = None
        self.identity = Identity()  # who the last start ran as (exec probes run as the same)
        self.stopping = False
        self.finished = asyncio.Event()
        self._wake = asyncio.Event()
        self._crashes = 0
        self._pull_failures = 0
        self.pulled: PulledImage | None = None
        self._probe_tasks: list[asyncio.Task[None]] = []
        self._kill_reason = ""
        self._resumed = False
        self._started_at = time.monotonic()
        prev_state = (previous or {}).get("state") or {}
        self._died_running = "running" in prev_state
        if "running" in prev_state:
            # it was running when the node went away: it died with the node
            self._resumed = True
            self.last_state = {"terminated": {
                "exitCode": 137, "reason": "ContainerStatusUnknown",
                "message": "The container could not be located when the pod was terminated",
                "startedAt": prev_state["running"].get("startedAt"), "finishedAt": now()}}
        elif "waiting" in prev_state and "terminated" in self.last_state:
            self._resumed = True  # it was waiting to be restarted: the next start is a restart
        elif "terminated" in prev_state:
            if self._restarts_after(int(prev_state["terminated"].get("exitCode", 0))):
                self.last_state = {"terminated": prev_state["terminated"]}
                self._resumed = True
            else:
                self.state = {"terminated": prev_state["terminated"]}
                self.finished.set()

    # -- status ------------------------------------------------------------------------------------

    def status(self) -> Obj:
        out: Obj = {"name": self.name, "image": self.spec.get("image", ""), "imageID": "",
                    "ready": self.ready, "restartCount": self.restart_count, "started": self.started,
                    "state": self.state, "lastState": self.last_state}
        if self.container_id:
            out["containerID"] = self.container_id
            out["imageID"] = f"local://{self.spec.get('image', '')}" if self.pulled is None else \
                f"{self.spec.get('image', '').split('@', 1)[0]}@{self.pulled.digest}"
        return out

    def waiting_reason(self) -> str | None:
        return (self.state.get("waiting") or {}).get("reason")

    def _changed(self) -> None:
        self.worker.status_changed()

    # -- policy ------------------------------------------------------------------------------------

    def _restarts_after(self, code: int) -> bool:
        policy = self.worker.restart_policy
        if self.init:
            return code != 0 and policy != "Never"
        return policy == "Always" or (policy == "OnFailure" and code != 0)

    def _backoff(self) -> float:
        """0 for the first restart, then base, 2*base, ... up to the maximum (kubelet's CrashLoopBackOff)."""
        config = self.worker.kubelet.config
        if self._crashes <= 1:
            return 0.0
        return backoff_delay(self._crashes - 2, config.restart_backoff, config.max_backoff)

    def _pull_backoff(self) -> float:
        """base, 2*base, ... up to the maximum after each failed pull (kubelet's ImagePullBackOff doubles
        as its CrashLoopBackOff does)."""
        config = self.worker.kubelet.config
        return backoff_delay(self._pull_failures - 1, config.restart_backoff, config.max_backoff)

    async def _pause(self, seconds: float) -> None:
        """Sleep unless woken (pod update) or stopping."""
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    def wake(self) -> None:
        self._wake.set()

    # -- running -----------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self._stop_probes()
            self.finished.set()

    async def _run(self) -> None:
        if self.finished.is_set():
            return
        if self._died_running:
            self._crashes = 1
            if not self._restarts_after(137):
                self.state, self.last_state = self.last_state, {}
                self._changed()
                return
        while not self.stopping:
            if self._resumed:
                self._resumed = False
                self.restart_count += 1
            try:
                self.pulled = await self._pull()
                argv, env, mounts, user = self._configure()
            except ImagePullError as exc:
                self._pull_failures += 1
                if exc.never:
                    await self._wait_state("ErrImageNeverPull", str(exc), "ErrImageNeverPull",
                                           self.worker.kubelet.config.restart_backoff)
                    continue
                reason = "ErrImagePull" if self._pull_failures % 2 else "ImagePullBackOff"
                message = str(exc) if reason == "ErrImagePull" else \
                    f'Back-off pulling image "{self.spec.get("image", "")}"'
                await self._wait_state(reason, message, "Failed" if reason == "ErrImagePull" else "BackOff",
                                       self._pull_backoff())
                continue
            except (ConfigError, VolumeError, RuntimeRefused) as exc:
                reason = "CreateContainerConfigError" if isinstance(exc, ConfigError) else "CreateContainerError"
                await self._wait_state(reason, f"Error: {exc}", "Failed", RETRY_PERIOD)
                continue
            code, terminated = await self._start_once(argv, env, mounts, user)
            if self.stopping:
                self.state = {"terminated": terminated}
                self._changed()
                return
            if not self._restarts_after(code):
                self.state = {"terminated": terminated}
                self._changed()
                return
            self.last_state = {"terminated": terminated}
            started = time.monotonic() - self._started_at
            if started > 2 * self.worker.kubelet.config.max_backoff:
                self._crashes = 0
            self._crashes += 1
            delay = self._backoff()
            if delay > 0:
                message = (f"back-off {delay:g}s restarting failed container={self.name} "
                           f"pod={self.worker.name}_{self.worker.namespace}({self.worker.uid})")
                await self._wait_state("CrashLoopBackOff", message, "BackOff", delay, event_message=(
                    "Back-off restarting failed container " + self.name + " in pod " + self.worker.name))
                if self.stopping:
                    return
            self.restart_count += 1

    async def _wait_state(self, reason: str, message: str, event: str, delay: float,
                          event_message: str | None = None) -> None:
        self.state = {"waiting": {"reason": reason, "message": message}}
        self.ready = False
        self.started = False
        self._changed()
        await self.worker.event(event, event_message or message, "Warning")
        deadline = time.monotonic() + delay
        while not self.stopping and time.monotonic() < deadline:
            await self._pause(deadline - time.monotonic())
            if reason.startswith("CreateContainer"):
                break  # a pod update may have fixed it: try again now

    async def _pull(self) -> PulledImage | None:
        """The pulled image this container runs (None: a program of this package or the host's)."""
        image = str(self.spec.get("image", ""))
        if not is_oci_image(image, self.spec.get("command")):
            return None
        worker = self.worker
        policy = str(self.spec.get("imagePullPolicy") or "IfNotPresent")
        secrets = [s for ref in (worker.pod.get("spec") or {}).get("imagePullSecrets") or []
                   if (s := worker.kubelet.secret(worker.namespace, str(ref.get("name", "")))) is not None]
        if policy != "Never":
            await worker.event("Pulling", f'Pulling image "{image}"')
        started = time.monotonic()
        try:
            pulled = await asyncio.get_running_loop().run_in_executor(
                None, worker.kubelet.images.get, image, policy, secrets)
        except PullError as exc:
            raise ImagePullError(str(exc) if exc.never else f'Failed to pull image "{image}": {exc}',
                                 never=exc.never) from exc
        if policy != "Never":
            await worker.event("Pulled", f'Successfully pulled image "{image}" in '
                                         f"{time.monotonic() - started:.3f}s")
        return pulled

    def _configure(self) -> tuple[list[str], dict[str, str], list[Mount], Identity]:
        worker = self.worker
        pod = worker.pod_view()
        pulled = self.pulled
        if pulled is None:
            user = identity(pod, self.spec)
            base = worker.kubelet.config.base_env(pod, user)
            point = entrypoint(self.spec.get("image", ""), self.spec.get("command"), self.spec.get("args"),
                               worker.kubelet.config.python)
            argv_template = point.argv
        else:
            users = ImageUsers(pulled.user, tuple(tuple(e) for e in image_passwd(pulled.rootfs)),
                               tuple(tuple(e) for e in image_group(pulled.rootfs)))
            user = identity(pod, self.spec, users)
            base = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "HOSTNAME": pod["metadata"]["name"], "HOME": user.home}
            for entry in pulled.env:
                key, _, value = entry.partition("=")
                base[key] = value
            argv_template = oci_argv(self.spec.get("command"), self.spec.get("args"), pulled.entrypoint, pulled.cmd)
            if not argv_template:
                raise RuntimeRefused("no command specified")
        env = build_env(pod, self.spec, worker.kubelet.secret, worker.kubelet.configmap, base)
        argv = expand_args(argv_template, env)
        mounts = worker.volumes.mounts(self.spec) if worker.volumes else []
        if pulled is not None:
            for point in [m.target for m in mounts] + [str(self.spec.get("workingDir") or pulled.working_dir)]:
                try:
                    inside_image(pulled.rootfs, point)
                except ValueError as exc:
                    raise RuntimeRefused(f"the image's {exc}") from exc
        for mount in mounts:
            if mount.device:  # the device is the container user's, as device_ownership_from_security_context
                try:
                    own_device(mount.source, user.uid, user.gid)
                except OSError as exc:
                    raise VolumeError(f"giving {mount.target} to the container's user: {exc}") from exc
        return argv, env, mounts, user

    async def _start_once(self, argv: list[str], env: dict[str, str], mounts: list[Mount],
                          user: Identity) -> tuple[int, Obj]:
        worker = self.worker
        kubelet = worker.kubelet
        self.dir.mkdir(parents=True, exist_ok=True)
        message_file = self.dir / "termination-log"
        message_file.write_bytes(b"")
        os.chmod(message_file, 0o666)
        message_path = self.spec.get("terminationMessagePath") or "/dev/termination-log"
        pulled = self.pulled
        runtime = kubelet.config.runtime_mounts() if pulled is None else []
        all_mounts = [*runtime, *mounts, Mount(message_file, message_path)]
        working_dir = self.spec.get("workingDir") or (pulled.working_dir if pulled is not None else "")
        spec = SandboxSpec(argv=argv, env=env, mounts=all_mounts, working_dir=working_dir,
                           hostname=worker.name, hide=kubelet.config.hide, identity=user,
                           userns_fd=kubelet.config.userns_fd, rootfs=pulled.rootfs if pulled is not None else None,
                           helpers=kubelet.config.helpers() if pulled is not None else [])
        self.identity = user
        if pulled is None:
            await worker.event("Pulled", f'Container image "{self.spec.get("image", "")}" already present on machine')
        await worker.event("Created", f"Created container {self.name}")
        writer = kubelet.logs.open(self.dir / f"{self.restart_count}.log")
        self.process = ContainerProcess(spec, writer, kubelet.config.bwrap, kubelet.config.setpriv)
        started_at = now()
        self._started_at = time.monotonic()
        self._kill_reason = ""
        try:
            await self.process.start()
        except OSError as exc:
            kubelet.logs.closed(writer)
            log.warning("container %s of %s/%s did not start: %s", self.name, worker.namespace, worker.name, exc)
            return 128, {"exitCode": 128, "reason": "StartError", "message": str(exc), "startedAt": started_at,
                         "finishedAt": now()}
        self.container_id = f"bwrap://{self.process.pid}"
        self.state = {"running": {"startedAt": started_at}}
        self.started = "startupProbe" not in self.spec
        self.ready = self.started and "readinessProbe" not in self.spec
        self._changed()
        await worker.event("Started", f"Started container {self.name}")
        self._start_probes()
        code = await self.process.wait()
        self._stop_probes()
        kubelet.logs.closed(writer)
        self.ready = False
        self.started = False
        terminated: Obj = {"exitCode": code, "reason": self._kill_reason or _terminated_reason(code),
                           "startedAt": started_at, "finishedAt": now(), "containerID": self.container_id}
        message = self._termination_message(message_file, writer.path, code)
        if message:
            terminated["message"] = message
        if code > 128 and code - 128 in (9, 15):
            terminated["signal"] = code - 128
        return code, terminated

    def _termination_message(self, path: Path, log_path: Path, code: int) -> str:
        try:
            text = path.read_bytes()[:TERMINATION_MESSAGE_LIMIT].decode(errors="replace")
        except OSError:
            text = ""
        if not text and code != 0 and self.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            text = tail_text(log_path)
        return text

    # -- probes ------------------------------------------------------------------------------------

    def _start_probes(self) -> None:
        host = self.worker.pod_ip or HOST_IP
        if "startupProbe" in self.spec:
            self._probe_tasks.append(asyncio.create_task(Prober(
                self.spec["startupProbe"], host, self.spec, self._exec, False, self._on_startup,
                self._probe_failed("Startup")).loop()))
        else:
            self._start_other_probes()

    def _start_other_probes(self) -> None:
        host = self.worker.pod_ip or HOST_IP
        if "readinessProbe" in self.spec:
            self._probe_tasks.append(asyncio.create_task(Prober(
                self.spec["readinessProbe"], host, self.spec, self._exec, False, self._on_readiness,
                self._probe_failed("Readiness")).loop()))
        if "livenessProbe" in self.spec:
            self._probe_tasks.append(asyncio.create_task(Prober(
                self.spec["livenessProbe"], host, self.spec, self._exec, True, self._on_liveness,
                self._probe_failed("Liveness")).loop()))

    def _stop_probes(self) -> None:
        for task in self._probe_tasks:
            task.cancel()
        self._probe_tasks.clear()

    def _probe_failed(self, kind: str) -> Any:
        def failed(result: ProbeResult) -> None:
            asyncio.get_running_loop().create_task(
                self.worker.event("Unhealthy", f"{kind} probe failed: {result.message}", "Warning"))
        return failed

    def _on_startup(self, ok: bool, result: ProbeResult) -> None:
        if ok:
            self.started = True
            self.ready = "readinessProbe" not in self.spec
            self._changed()
            current = asyncio.current_task()
            self._probe_tasks = [t for t in self._probe_tasks if t is not current]
            self._start_other_probes()
            if current is not None:
                current.cancel()
        else:
            self._kill_for_probe("startup", result)

    def _on_readiness(self, ok: bool, result: ProbeResult) -> None:
        if self.ready != ok:
            self.ready = ok
            self._changed()

    def _on_liveness(self, ok: bool, result: ProbeResult) -> None:
        if not ok:
            self._kill_for_probe("liveness", result)

    def _kill_for_probe(self, kind: str, result: ProbeResult) -> None:
        process = self.process
        if process is None:
            return
        self.ready = False
        self._changed()
        grace = float(self.worker.pod.get("spec", {}).get("terminationGracePeriodSeconds", 30))
        asyncio.get_running_loop().create_task(self.worker.event(
            "Killing", f"Container {self.name} failed {kind} probe, will be restarted"))
        asyncio.get_running_loop().create_task(process.stop(grace))

    async def _exec(self, argv: list[str], timeout: float) -> tuple[int, str]:
        """Run argv inside this container (its user, mount and PID namespaces, root and working
        directory) as the container's user with its capabilities, as a runtime's exec does."""
        process = self.process
        target = process.main_pid() if process else None
        if target is None:
            return 1, "container is not running"
        config = self.worker.kubelet.config
        user = self.identity
        env = build_env(self.worker.pod_view(), self.spec, self.worker.kubelet.secret,
                        self.worker.kubelet.configmap, config.base_env(self.worker.pod, user))
        enter = ["nsenter", "-t", str(target)]
        if config.userns_fd is not None:
            enter += ["-U"]
        elif os.geteuid() != 0:
            enter += ["-U", "--preserve-credentials"]
        enter += ["-m", "-p", "-u", "-i", "-r", "-w", "--"]
        if os.geteuid() == 0:
            switch: str | list[str] = config.setpriv if self.pulled is None else helper_setpriv(config.helpers())
            enter += user_argv(user, container_capabilities(user, config.userns_fd), switch)
        proc = await asyncio.create_subprocess_exec(
            *enter, *argv,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env=env, start_new_session=True)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            await proc.wait()
            raise
        return proc.returncode or 0, out.decode(errors="replace")

    # -- stopping ----------------------------------------------------------------------------------

    async def stop(self, grace: float) -> None:
        self.stopping = True
        self.wake()
        process = self.process
        if process is not None and process.proc is not None and process.proc.returncode is None:
            await process.stop(grace)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.finished.wait(), 5.0)


class PodWorker:
    """Everything the node does for one pod, from scheduling to removal."""

    def __init__(self, kubelet: Kubelet, pod: Obj) -> None:
        self.kubelet = kubelet
        self.pod = pod
        meta = pod["metadata"]
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.dir = kubelet.config.root / "pods" / self.uid
        self.pod_ip = kubelet.ips.get(self.uid) or ""
        self.volumes: PodVolumes | None = None
        self.sandbox_ready = False
        status = pod.get("status") or {}
        previous = {s["name"]: s for s in status.get("containerStatuses") or []}
        previous_init = {s["name"]: s for s in status.get("initContainerStatuses") or []}
        spec = pod.get("spec") or {}
        self.restart_policy: str = spec.get("restartPolicy", "Always")
        self.init_runners = [ContainerRunner(self, c, True, previous_init.get(c["name"]))
                             for c in spec.get("initContainers") or []]
        self.runners = [ContainerRunner(self, c, False, previous.get(c["name"]))
                        for c in spec.get("containers") or []]
        self.start_time = status.get("startTime") or ""
        self.terminating = asyncio.Event()
        self.gone = False
        self._dirty = asyncio.Event()
        self._last_written: Obj | None = None
        self._task: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._events: set[str] = set()
        self.shutting_down = False
        kubelet.logs.register(self.namespace, self.name, {
            r.name: ContainerLogs(r.dir, r.waiting_reason) for r in [*self.init_runners, *self.runners]})

    # -- plumbing ----------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._main(), name=f"pod-{self.namespace}/{self.name}")
        self._writer = asyncio.create_task(self._write_loop(), name=f"pod-status-{self.namespace}/{self.name}")

    def update(self, pod: Obj) -> None:
        self.pod = pod
        if pod["metadata"].get("deletionTimestamp"):
            self.terminating.set()
        for runner in [*self.init_runners, *self.runners]:
            runner.wake()

    def deleted(self) -> None:
        self.gone = True
        self.terminating.set()

    def pod_view(self) -> Obj:
        """The pod with what this node knows of its status (the watch may not have caught up)."""
        status = dict(self.pod.get("status") or {})
        if self.pod_ip:
            status.update({"podIP": self.pod_ip, "podIPs": [{"ip": self.pod_ip}], "hostIP": HOST_IP,
                           "hostIPs": [{"ip": HOST_IP}]})
        return {**self.pod, "status": status}

    async def event(self, reason: str, message: str, type_: str = "Normal") -> None:
        key = f"{reason}:{message}"
        if reason in ("Failed", "FailedMount", "BackOff", "Unhealthy") and key in self._events:
            return
        self._events.add(key)
        await self.kubelet.api.record_event({**self.pod, "kind": "Pod", "apiVersion": "v1"}, reason, message,
                                            type_, "kubelet")

    def status_changed(self) -> None:
        self._dirty.set()

    async def _write_loop(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            if self.gone or self.shutting_down:
                continue
            try:
                await self._write_status()
            except StatusError as exc:
                if exc.code == 404:
                    continue
                log.warning("status of %s/%s: %s", self.namespace, self.name, exc)
                self._dirty.set()
                await asyncio.sleep(0.2)
            except Exception:
                log.exception("status of %s/%s", self.namespace, self.name)
                await asyncio.sleep(0.5)
                self._dirty.set()

    async def flush(self) -> None:
        """Write the current status now (used before the pod's phase matters to someone)."""
        if not self.gone and not self.shutting_down:
            with contextlib.suppress(StatusError):
                await self._write_status()

    def compute_status(self) -> Obj:
        init_statuses = [r.status() for r in self.init_runners]
        statuses = [r.status() for r in self.runners]
        init_failed = any(r.finished.is_set() and (r.state.get("terminated") or {}).get("exitCode", 0) != 0
                          for r in self.init_runners)
        phase = pod_phase(self.restart_policy, init_statuses, statuses, init_failed)
        old = self.pod.get("status") or {}
        scheduled = next((c for c in old.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
        conditions = carry_transition_times(
            pod_conditions(phase, scheduled, self.sandbox_ready, init_statuses, statuses),
            (self._last_written or {}).get("conditions") or old.get("conditions") or [])
        status: Obj = {"phase": phase, "conditions": conditions, "hostIP": HOST_IP, "hostIPs": [{"ip": HOST_IP}],
                       "containerStatuses": statuses, "qosClass": old.get("qosClass", "BestEffort")}
        if self.pod_ip:
            status["podIP"] = self.pod_ip
            status["podIPs"] = [{"ip": self.pod_ip}]
        if self.start_time:
            status["startTime"] = self.start_time
        if init_statuses:
            status["initContainerStatuses"] = init_statuses
        return status

    async def _write_status(self) -> None:
        status = self.compute_status()
        if status == self._last_written:
            return
        await self.kubelet.api.patch(PODS, self.namespace, self.name, {"status": status}, status=True)
        self._last_written = status

    # -- the pod's life ----------------------------------------------------------------------------

    async def _main(self) -> None:
        try:
            await self._life()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("pod %s/%s failed on the node", self.namespace, self.name)

    async def _life(self) -> None:
        phase = (self.pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            await self.terminating.wait()
            await self._finish()
            return
        if not self.terminating.is_set():
            self.pod_ip = self.kubelet.ips.allocate(self.uid)
            self.start_time = self.start_time or now()
            self.status_changed()
            await self._prepare_volumes()
        if not self.terminating.is_set():
            self.sandbox_ready = True
            self.status_changed()
            for runner in self.init_runners:
                if runner.finished.is_set() and (runner.state.get("terminated") or {}).get("exitCode") == 0:
                    continue
                task = asyncio.create_task(runner.run())
                await self._until(runner.finished)
                if self.terminating.is_set():
                    await runner.stop(self._grace())
                    task.cancel()
                    break
                if (runner.state.get("terminated") or {}).get("exitCode", 0) != 0:
                    break  # Never: the pod failed
        init_ok = all((r.state.get("terminated") or {}).get("exitCode") == 0 for r in self.init_runners)
        if not self.terminating.is_set() and init_ok:
            tasks = {asyncio.create_task(r.run()) for r in self.runners}
            stop = asyncio.ensure_future(self.terminating.wait())
            try:
                running: set[asyncio.Future[Any]] = set(tasks)
                while running and not stop.done():
                    _, pending = await asyncio.wait(running | {stop}, return_when=asyncio.FIRST_COMPLETED)
                    running = pending - {stop}
            finally:
                stop.cancel()
            if self.terminating.is_set():
                await self._stop_all(self._grace())
            await asyncio.gather(*tasks, return_exceptions=True)
        self.status_changed()
        await self.flush()
        await self.terminating.wait()
        await self._finish()

    async def _until(self, event: asyncio.Event) -> None:
        done = asyncio.ensure_future(event.wait())
        stop = asyncio.ensure_future(self.terminating.wait())
        try:
            await asyncio.wait({done, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            done.cancel()
            stop.cancel()

    def _grace(self) -> float:
        if self.gone:
            return 0.0
        meta, spec = self.pod["metadata"], self.pod.get("spec") or {}
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds", 30)
        return float(grace)

    async def _prepare_volumes(self) -> None:
        volumes = PodVolumes(self.pod, self.dir, self.kubelet.secret, self.kubelet.configmap, self.kubelet.claims)
        while not self.terminating.is_set():
            try:
                volumes.pod = self.pod_view()
                volumes.prepare()
                self.volumes = volumes
                return
            except VolumeError as exc:
                await self.event("FailedMount", f"MountVolume.SetUp failed: {exc}", "Warning")
            except Exception as exc:
                log.warning("volumes of %s/%s: %s", self.namespace, self.name, exc)
                await self.event("FailedMount", f"MountVolume.SetUp failed: {exc}", "Warning")
            stop = asyncio.ensure_future(self.terminating.wait())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop, RETRY_PERIOD)
            stop.cancel()

    async def _stop_all(self, grace: float) -> None:
        runners = [*self.init_runners, *self.runners]
        for runner in runners:
            if runner.process is not None and runner.process.proc is not None and \
                    runner.process.proc.returncode is None and not self.shutting_down:
                await self.event("Killing", f"Stopping container {runner.name}")
        await asyncio.gather(*(r.stop(grace) for r in runners), return_exceptions=True)

    async def _finish(self) -> None:
        """Containers are stopped: remove the pod for good, then its traces on the node."""
        if not self.gone:
            await self.flush()
            await self.kubelet.api.delete(PODS, self.namespace, self.name, grace_period=0, uid=self.uid)
        self.cleanup()

    def cleanup(self) -> None:
        self.kubelet.forget(self)
        with contextlib.suppress(OSError):  # logs are a courtesy; removing the pod is not
            keep_terminated(self.dir / "containers", self.kubelet.config.root / TERMINATED,
                            f"{self.namespace}_{self.name}_{self.uid}")
        shutil.rmtree(self.dir, ignore_errors=True)

    async def shutdown(self, grace: float) -> None:
        """`cdi up` is stopping: stop the containers, keep the pod (the next start resumes it)."""
        self.shutting_down = True
        await self._stop_all(grace)
        for task in (self._task, self._writer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task


class Kubelet:
    def __init__(self, api: LocalApi, config: KubeletConfig, ips: PodIPs, logs: NodeLogs,
                 publish: Any) -> None:
        self.api = api
        self.config = config
        self.ips = ips
        self.logs = logs
        self.publish = publish  # PersistentVolume -> Published (raises when its bytes are not here)
        self.images = ImageStore(config.root / "images", config.insecure_registries)
        self.workers: dict[str, PodWorker] = {}
        self._watch: asyncio.Task[None] | None = None

    def secret(self, namespace: str, name: str) -> Obj | None:
        return self.api.get(SECRETS, namespace, name)

    def configmap(self, namespace: str, name: str) -> Obj | None:
        return self.api.get(CONFIGMAPS, namespace, name)

    def claims(self, namespace: str, name: str) -> Published:
        pvc = self.api.get(PVCS, namespace, name)
        if pvc is None:
            raise VolumeError(f'persistentvolumeclaim "{name}" not found')
        volume = (pvc.get("spec") or {}).get("volumeName")
        if not volume or (pvc.get("status") or {}).get("phase") != "Bound":
            raise VolumeError(f'persistentvolumeclaim "{name}" is not bound')
        pv = self.api.get(PVS, None, volume)
        if pv is None:
            raise VolumeError(f'persistentvolume "{volume}" not found')
        try:
            published = self.publish(pv)
        except Exception as exc:
            raise VolumeError(str(exc)) from exc
        return Published(published.path, published.block)

    async def start(self) -> None:
        (self.config.root / "pods").mkdir(parents=True, exist_ok=True)
        if self.config.userns_fd is None:
            self.config.userns_fd = open_user_namespace()
        known = set()
        for pod in self.api.list(PODS):
            if (pod.get("spec") or {}).get("nodeName") != self.config.node_name:
                continue
            known.add(pod["metadata"]["uid"])
            ip = (pod.get("status") or {}).get("podIP")
            if ip:
                self.ips.reserve(pod["metadata"]["uid"], ip)
        for leftover in (self.config.root / "pods").iterdir():
            if leftover.name not in known:
                shutil.rmtree(leftover, ignore_errors=True)
        self._watch = asyncio.create_task(self._follow(), name="kubelet-pods")

    async def _follow(self) -> None:
        while True:
            try:
                async for type_, pod in self.api.events(PODS):
                    self._handle(type_, pod)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("kubelet: pod watch failed; watching again")
                await asyncio.sleep(1.0)

    def _handle(self, type_: str, pod: Obj) -> None:
        if (pod.get("spec") or {}).get("nodeName") != self.config.node_name:
            return
        uid = pod["metadata"]["uid"]
        worker = self.workers.get(uid)
        if type_ == "DELETED":
            if worker is not None:
                worker.deleted()
            else:
                self.ips.release(uid)
            return
        if worker is None:
            worker = PodWorker(self, pod)
            self.workers[uid] = worker
            worker.start()
        worker.update(pod)

    def forget(self, worker: PodWorker) -> None:
        if self.workers.get(worker.uid) is worker:
            del self.workers[worker.uid]
        self.ips.release(worker.uid)
        self.logs.unregister(worker.namespace, worker.name)
        if worker._writer is not None:
            worker._writer.cancel()

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch
        await asyncio.gather(*(w.shutdown(self.config.shutdown_grace) for w in list(self.workers.values())),
                             return_exceptions=True)
        if self.config.userns_fd is not None:
            os.close(self.config.userns_fd)
            self.config.userns_fd = None
