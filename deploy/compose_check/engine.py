"""The check's own Docker engine, and the images it builds there.

A ``dockerd`` of the check's own: its data root, exec root, socket and pid file are in
the cache folder, it makes no bridge and touches no iptables, and the check talks to it
only through its own socket (``DOCKER_HOST``), so another engine running on the machine
is never used or touched. Images and the build cache stay in the data root between runs;
containers never outlive a run.

The base image ``python:3.11-slim`` cannot be pulled here (no Docker Hub): Debian
bookworm's Python 3.11, debootstrapped once into the cache and imported under that name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

# Debian packages the check runs, by the command that shows each is there.
PACKAGES = {
    "dockerd": "docker.io",
    "docker-compose": "docker-compose",
    "debootstrap": "debootstrap",
    "ss": "iproute2",
}
# Debian's docker client, which matches its dockerd (another one may come first on PATH).
DOCKER = "/usr/bin/docker"
BASE_IMAGE = "python:3.11-slim"
BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "python-is-python3", "ca-certificates")
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# The machine's CA bundle, which the package index's certificates chain to here; builds
# get it as a secret, so it is in no layer.
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


class CheckError(Exception):
    """A step of the check failed; the message says which and why."""


def run(
    command: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    capture: bool | Literal["stdout"] = False,
    check: bool = True,
    timeout_s: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command; a failure raises ``CheckError`` with its last lines of output.
    ``capture``: keep stdout and stderr (True), stdout only, or neither (False)."""
    result = subprocess.run(
        list(command),
        env=env,
        stdin=subprocess.DEVNULL,
        text=True,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture is True else None,
        timeout=timeout_s,
        check=False,
    )
    if result.returncode in (130, -signal.SIGINT):
        raise KeyboardInterrupt(command[0])  # the child had the Ctrl-C first
    if check and result.returncode != 0:
        tail = "\n".join(((result.stdout or "") + (result.stderr or "")).splitlines()[-15:])
        raise CheckError(f"{' '.join(command[:4])} ... exited with {result.returncode}\n{tail}")
    return result


def install_packages() -> list[str]:
    """apt-get install what is missing of ``PACKAGES``; the packages installed."""
    missing = [package for command, package in PACKAGES.items() if shutil.which(command) is None]
    if missing:
        if os.geteuid() != 0:
            raise CheckError(f"missing {', '.join(missing)}: run as root, or install them")
        apt = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        if not any(Path("/var/lib/apt/lists").glob("*_Packages")):
            run(["apt-get", "-q", "update"], env=apt, capture=True)
        with _no_service_starts():
            run(["apt-get", "install", "-y", "-q", *missing], env=apt, capture=True)
    return missing


@contextlib.contextmanager
def _no_service_starts() -> Iterator[None]:
    """Keep apt-get from starting the system's Docker service (with its bridge and
    iptables rules) where an init system would: Debian's policy-rc.d, answering 101
    ("not allowed"), for the install only, unless the machine has one already."""
    policy = Path("/usr/sbin/policy-rc.d")
    if policy.exists():
        yield
        return
    policy.write_text(
        "#!/bin/sh\n# make compose-check: no service starts while it installs\nexit 101\n"
    )
    policy.chmod(0o755)
    try:
        yield
    finally:
        policy.unlink()


class Engine:
    """``dockerd`` on ``cache/run/docker.sock``; ``with Engine(cache) as engine: ...``
    starts it and, on the way out, removes every container and stops it."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache
        self.data_root = cache / "docker"
        # Short: containerd's sockets live under it, and a unix socket path has 108 bytes.
        self.exec_root = cache / "exec"
        self.socket = cache / "run" / "docker.sock"
        self.pid_file = cache / "run" / "docker.pid"
        self.log_file = cache / "run" / "dockerd.log"
        # Only this engine: no context, TLS or config of another one from the environment,
        # and no COMPOSE_* setting that would change which files or project compose uses.
        inherited = {
            k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "COMPOSE_"))
        }
        self.env = {**inherited, "DOCKER_HOST": f"unix://{self.socket}"}
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Engine:
        for folder in (self.data_root, self.exec_root, self.socket.parent):
            folder.mkdir(parents=True, exist_ok=True)
        self._stop_leftover()
        with open(self.log_file, "wb") as log:
            self._process = subprocess.Popen(
                [
                    "dockerd",
                    f"--data-root={self.data_root}",
                    f"--exec-root={self.exec_root}",
                    f"--host=unix://{self.socket}",
                    f"--pidfile={self.pid_file}",
                    "--iptables=false",
                    "--ip6tables=false",
                    "--bridge=none",
                    f"--storage-driver={self._storage_driver()}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C reaches the check, which stops it in order
            )
        try:
            self._wait_until_up()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._process is None:
            return
        with contextlib.suppress(CheckError, subprocess.TimeoutExpired):
            ids = self.containers()
            if ids:
                self.docker("rm", "-f", "-v", *ids, capture=True, timeout_s=120)
        self._process.send_signal(signal.SIGTERM)
        try:
            self._process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None
        self._unmount_leftovers()

    def _unmount_leftovers(self) -> None:
        """dockerd leaves the host's network namespace bind-mounted in its exec root (for
        host networking) when it stops: unmount it, so nothing of the engine stays."""
        for mount in (self.exec_root / "netns").glob("*"):
            if os.path.ismount(mount):
                run(["umount", str(mount)], capture=True, check=False)

    def docker(
        self,
        *args: str,
        capture: bool | Literal["stdout"] = False,
        check: bool = True,
        timeout_s: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """The Debian docker client, on this engine's socket."""
        return run([DOCKER, *args], env=self.env, capture=capture, check=check, timeout_s=timeout_s)

    def containers(self) -> list[str]:
        return self.docker("ps", "-aq", capture=True).stdout.split()

    def has_image(self, tag: str) -> bool:
        return self.docker("image", "inspect", tag, capture=True, check=False).returncode == 0

    def ensure_base_image(self) -> bool:
        """Import ``BASE_IMAGE`` from a debootstrapped file system (made once, kept in the
        cache); True when it had to be imported."""
        if self.has_image(BASE_IMAGE):
            return False
        archive = self.cache / "base" / f"{BASE_SUITE}-python3.tar"
        if not archive.exists():
            _debootstrap(archive)
        with open(archive, "rb") as tar:
            subprocess.run(
                [
                    DOCKER,
                    "import",
                    "--change",
                    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "--change",
                    "ENV LANG=C.UTF-8",
                    "--change",
                    'CMD ["python3"]',
                    "-",
                    BASE_IMAGE,
                ],
                stdin=tar,
                env=self.env,
                check=True,
                capture_output=True,
            )
        return True

    def build(self, context: Path, tag: str, dockerfile: Path | None = None) -> None:
        """``docker build`` with BuildKit, the host's network and the CA bundle as the
        ``pip-cert`` secret; the build's output goes to ``cache/run/build-*.log``."""
        command = [DOCKER, "build", "--network=host", "--progress=plain", f"--tag={tag}"]
        if CA_BUNDLE.is_file():
            command.append(f"--secret=id=pip-cert,src={CA_BUNDLE}")
        if dockerfile is not None:
            command.append(f"--file={dockerfile}")
        log_path = self.socket.parent / f"build-{tag.replace('/', '_').replace(':', '_')}.log"
        with open(log_path, "w") as log:
            result = subprocess.run(
                [*command, str(context)],
                env={**self.env, "DOCKER_BUILDKIT": "1"},
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
            )
        if result.returncode != 0:
            tail = "\n".join(log_path.read_text().splitlines()[-20:])
            raise CheckError(f"building {tag} failed (log: {log_path}):\n{tail}")
        leaked = self.docker(
            "run", "--rm", "--network=none", "--entrypoint=/bin/sh", tag,
            "-c", "test ! -e /run/secrets/pip-cert", check=False,
        )  # fmt: skip
        if leaked.returncode != 0:
            raise CheckError(f"{tag} holds the build secret /run/secrets/pip-cert")

    def _storage_driver(self) -> str:
        # overlay2 where the kernel has overlayfs (and the data root is not on one); vfs,
        # a full copy per layer, only where it has not.
        with contextlib.suppress(OSError):
            if "overlay" in Path("/proc/filesystems").read_text().split():
                return "overlay2"
        return "vfs"

    def _stop_leftover(self) -> None:
        """Stop a dockerd that an interrupted run of the check left on this data root."""
        with contextlib.suppress(OSError, ValueError):
            pid = int(self.pid_file.read_text())
            if str(self.data_root).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + STOP_TIMEOUT_S
                while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                    time.sleep(0.2)
        self._unmount_leftovers()

    def _wait_until_up(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                raise CheckError(f"dockerd exited with {self._process.returncode}: {self.log_file}")
            if self.docker("version", capture=True, check=False).returncode == 0:
                return
            if time.monotonic() > deadline:
                raise CheckError(
                    f"dockerd did not answer in {START_TIMEOUT_S:.0f} s: {self.log_file}"
                )
            time.sleep(0.3)


def _debootstrap(archive: Path) -> None:
    """Debian's Python 3.11 as a minimal root file system, packed as ``archive``."""
    root = archive.with_suffix(".root")
    shutil.rmtree(root, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    run(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(BASE_PACKAGES)}",
            BASE_SUITE,
            str(root),
            DEBIAN_MIRROR,
        ],
        capture=True,
    )
    # What an image should not carry: downloaded packages and package lists.
    for leftover in [*root.glob("var/cache/apt/archives/*.deb"), *root.glob("var/lib/apt/lists/*")]:
        if leftover.is_file():
            leftover.unlink()
    partial = archive.with_suffix(".partial")
    run(["tar", "-C", str(root), "-cf", str(partial), "."], capture=True)
    partial.rename(archive)
    shutil.rmtree(root)
