"""The cached Debian sid chroot the local pool runs in: build, mount, processes, unmount.

Everything here runs commands (subprocess with argument lists, never a shell string);
what the pool's configuration says lives in :mod:`condor_sched.localpool.config`.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

log = logging.getLogger(__name__)

#: The only environment daemons and tools in the chroot see (host variables must not leak).
CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
PACKAGES = ("minicondor", "python3", "python3-venv")
DEFAULT_MIRROR = "http://deb.debian.org/debian"


class PoolError(RuntimeError):
    """The local pool cannot be built, started or stopped; the message says why."""


def run(cmd: Sequence[str], *, check: bool = True, timeout_s: float | None = 600,
        env: dict[str, str] | None = None, capture: bool = True) -> subprocess.CompletedProcess[str]:
    """The one gate through which this package runs host commands."""
    log.debug("run %s", cmd)
    try:
        proc = subprocess.run(list(cmd), text=True, timeout=timeout_s, env=env,
                              stdout=subprocess.PIPE if capture else None,
                              stderr=subprocess.STDOUT if capture else None)
    except FileNotFoundError as e:
        raise PoolError(f"cannot run {cmd[0]}: {e.strerror}") from None
    except subprocess.TimeoutExpired:
        raise PoolError(f"{' '.join(cmd)} did not finish within {timeout_s} s") from None
    if check and proc.returncode != 0:
        tail = (proc.stdout or "")[-2000:]
        raise PoolError(f"{' '.join(cmd)} failed with exit code {proc.returncode}:\n{tail}")
    return proc


def in_chroot(root: Path, cmd: Sequence[str], **kwargs) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` inside ``root`` with a clean environment."""
    env_args = [f"{k}={v}" for k, v in CLEAN_ENV.items()]
    return run(["env", "-i", *env_args, "chroot", str(root), *cmd], env=dict(CLEAN_ENV), **kwargs)


def mirror_from_sources(sources_list: str = "/etc/apt/sources.list",
                        sources_dir: str = "/etc/apt/sources.list.d") -> str:
    """The first Debian (not security) mirror URI of the host's apt sources."""
    candidates: list[str] = []
    d = Path(sources_dir)
    if d.is_dir():
        for f in sorted(d.glob("*.sources")):
            candidates += parse_deb822_uris(f.read_text(errors="replace"))
    for f in [Path(sources_list), *(sorted(d.glob("*.list")) if d.is_dir() else [])]:
        if f.is_file():
            candidates += parse_one_line_uris(f.read_text(errors="replace"))
    for uri in candidates:
        if "security" not in uri:
            return uri
    return DEFAULT_MIRROR


def parse_deb822_uris(text: str) -> list[str]:
    """``URIs:`` values of a deb822 .sources file, in order."""
    uris: list[str] = []
    for line in text.splitlines():
        m = re.match(r"^URIs:\s*(.+)$", line.strip())
        if m:
            uris += [u for u in m.group(1).split() if re.match(r"^https?://", u)]
    return uris


def parse_one_line_uris(text: str) -> list[str]:
    """Mirror URIs of ``deb`` lines of a one-line-style sources.list."""
    uris: list[str] = []
    for line in text.splitlines():
        words = [w for w in line.split() if not (w.startswith("[") or w.endswith("]"))]
        if len(words) >= 2 and words[0] == "deb" and re.match(r"^https?://", words[1]):
            uris.append(words[1])
    return uris


def ensure_debootstrap() -> None:
    if shutil.which("debootstrap") is None:
        run(["apt-get", "install", "-y", "debootstrap"], env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def build_root(root: Path, user: str, uid: int, mirror: str | None = None) -> None:
    """Build the chroot into a temporary sibling and rename it to ``root`` when complete.

    A half-built tree therefore never sits at ``root``; a failed build leaves a
    ``<root>.build-*`` directory that the next build removes.
    """
    root.parent.mkdir(parents=True, exist_ok=True)
    for stale in root.parent.glob(f"{root.name}.build-*"):
        _remove_tree(stale)
    ensure_debootstrap()
    mirror = mirror or mirror_from_sources()
    tmp = Path(tempfile.mkdtemp(prefix=f"{root.name}.build-", dir=root.parent))
    os.chmod(tmp, 0o755)
    log.info("debootstrap sid into %s from %s", tmp, mirror)
    run(["debootstrap", "--variant=minbase", "sid", str(tmp), mirror], timeout_s=1800)
    mount_root(tmp)
    try:
        apt_install(tmp, PACKAGES)
        ensure_user(tmp, user, uid)
        in_chroot(tmp, ["apt-get", "clean"], check=False)
    finally:
        stop_processes(tmp)
        unmount_all(tmp)
    (tmp / ".cosched-complete").write_text("minicondor " + " ".join(PACKAGES) + "\n")
    tmp.rename(root)


def apt_install(root: Path, packages: Sequence[str]) -> None:
    """Install Debian ``packages`` in the chroot (mounted), after refreshing its stale lists."""
    in_chroot(root, ["apt-get", "-o", "Acquire::Check-Valid-Until=false", "update"], timeout_s=900)
    run(["env", "-i", *[f"{k}={v}" for k, v in CLEAN_ENV.items()], "DEBIAN_FRONTEND=noninteractive",
         "chroot", str(root), "apt-get", "install", "-y", "--no-install-recommends", *packages], timeout_s=1800)


#: Bump to rebuild every cached venv (e.g. when the steps below change).
VENV_STEP_VERSION = 1
VENV_STAMP = ".cosched-venv"
HOST_CA_SOURCE = "/etc/ssl/certs/ca-certificates.crt"
HOST_CA_BUNDLE = "/tmp/cosched-host-ca-certificates.crt"


def venv_stamp(requirements: Sequence[str], path_dirs: Sequence[str], scripts: Mapping[str, str]) -> str:
    """What a venv was built from; a cached venv with another stamp is rebuilt."""
    return "\n".join([f"step {VENV_STEP_VERSION}", *[f"requires {r}" for r in requirements],
                      *[f"path {d}" for d in path_dirs],
                      *[f"script {name} {hashlib.sha256(text.encode()).hexdigest()}"
                        for name, text in sorted(scripts.items())], ""])


def ensure_venv(root: Path, venv: str, requirements: Sequence[str], path_dirs: Sequence[str],
                scripts: Mapping[str, str]) -> bool:
    """Build a venv at ``venv`` (a path inside ``root``) with the chroot's python3 and pip
    ``requirements`` from PyPI, put ``path_dirs`` on its path, write ``scripts`` (name ->
    text) into its bin/; skipped when the venv's stamp says it was built the same way.

    Idempotent, and safe on a cache built before this step existed. Returns whether it built.
    """
    target = root / venv.lstrip("/")
    stamp = venv_stamp(requirements, path_dirs, scripts)
    if (target / VENV_STAMP).is_file() and (target / VENV_STAMP).read_text() == stamp:
        return False
    if processes_in(root):
        raise PoolError(f"the pool in {root} is running; stop it (pool down) before building its venv")
    log.info("building the sidecar venv %s in %s (pip: %s)", venv, root, " ".join(requirements))
    shutil.rmtree(target, ignore_errors=True)
    # pip in the chroot reaches PyPI as the host does: its resolver and its CA bundle (a proxy's CA).
    if Path("/etc/resolv.conf").is_file():
        shutil.copyfile("/etc/resolv.conf", root / "etc/resolv.conf")
    host_ca = root / HOST_CA_BUNDLE.lstrip("/")
    cert_args = []
    if Path(HOST_CA_SOURCE).is_file():
        shutil.copyfile(HOST_CA_SOURCE, host_ca)
        cert_args = ["--cert", HOST_CA_BUNDLE]
    mount_root(root)
    try:
        if in_chroot(root, ["python3", "-c", "import ensurepip"], check=False).returncode != 0:
            apt_install(root, ["python3-venv"])  # a root built before python3-venv was in PACKAGES
        in_chroot(root, ["python3", "-m", "venv", venv])
        in_chroot(root, [f"{venv}/bin/pip", "install", "--no-cache-dir", "--disable-pip-version-check",
                         "--quiet", "--root-user-action=ignore", *cert_args, *requirements],
                  timeout_s=1800)
        purelib = in_chroot(root, [f"{venv}/bin/python3", "-c",
                                   "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip()
        (root / purelib.lstrip("/") / "condor_sched.pth").write_text("".join(f"{d}\n" for d in path_dirs))
        for name, text in scripts.items():
            (target / "bin" / name).write_text(text)
            (target / "bin" / name).chmod(0o755)
        in_chroot(root, ["apt-get", "clean"], check=False)
    finally:
        host_ca.unlink(missing_ok=True)
        stop_processes(root)
        unmount_all(root)
    (target / VENV_STAMP).write_text(stamp)
    return True


def _remove_tree(path: Path) -> None:
    if mounts_under(path):
        stop_processes(path)
        unmount_all(path)
    if mounts_under(path):
        raise PoolError(f"{path} still has mounts; not removing it")
    shutil.rmtree(path, ignore_errors=True)


def is_built(root: Path) -> bool:
    return (root / ".cosched-complete").is_file() and (root / "usr/sbin/condor_master").exists()


def ensure_user(root: Path, user: str, uid: int) -> None:
    """Create ``user`` with ``uid`` in the chroot and on the host, when missing."""
    if not re.match(r"^[a-z_][a-z0-9_-]{0,30}$", user):
        raise PoolError(f"bad user name {user!r}")
    if in_chroot(root, ["id", "-u", user], check=False).returncode != 0:
        in_chroot(root, ["useradd", "-u", str(uid), "-m", "-s", "/bin/sh", user])
    if run(["id", "-u", user], check=False).returncode != 0:
        run(["useradd", "-u", str(uid), "-M", "-s", "/usr/sbin/nologin", user])


# --- mounts -------------------------------------------------------------------------

def _unescape_mount(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts_under(root: Path) -> list[str]:
    """Mount points at or under ``root`` in /proc/mounts, in mount order."""
    prefix = str(root).rstrip("/")
    points = []
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2:
            point = _unescape_mount(parts[1])
            if point == prefix or point.startswith(prefix + "/"):
                points.append(point)
    return points


def is_mounted(point: Path) -> bool:
    return str(point).rstrip("/") in mounts_under(point)


def mount_root(root: Path) -> None:
    """``mount --bind ROOT ROOT`` first (the starter's unshare needs it), then proc."""
    if not is_mounted(root):
        run(["mount", "--bind", str(root), str(root)])
    if not is_mounted(root / "proc"):
        run(["mount", "-t", "proc", "proc", str(root / "proc")])


def bind(source: Path, target: Path, read_only: bool = False, recursive: bool = False) -> None:
    """``mount --bind`` (``recursive``: ``--rbind``, the mounts below ``source`` too, made a
    slave so that no unmount under ``target`` ever reaches the host's mounts)."""
    target.mkdir(parents=True, exist_ok=True)
    if is_mounted(target):
        return
    run(["mount", "--rbind" if recursive else "--bind", str(source), str(target)])
    if recursive:
        run(["mount", "--make-rslave", str(target)])
    if read_only:
        run(["mount", "-o", "remount,bind,ro", str(target)])


def unmount_all(root: Path) -> None:
    """Unmount everything under ``root``, deepest and latest first, then check."""
    for _ in range(3):
        points = mounts_under(root)
        if not points:
            return
        for point in reversed(points):
            if run(["umount", point], check=False).returncode != 0:
                time.sleep(0.2)
    left = mounts_under(root)
    if left:
        for point in reversed(left):
            run(["umount", "-l", point], check=False)
        left = mounts_under(root)
    if left:
        raise PoolError(f"still mounted under {root}: {', '.join(left)}")


# --- processes ----------------------------------------------------------------------

def processes_in(root: Path) -> list[int]:
    """Pids of processes whose root directory is ``root`` (they are the pool's)."""
    target = os.path.realpath(root)
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "root") == target:
                pids.append(int(entry.name))
        except OSError:
            continue
    return sorted(pids)


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def wait_gone(root: Path, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        pids = processes_in(root)
        if not pids or time.monotonic() >= deadline:
            return pids
        time.sleep(0.2)


def stop_processes(root: Path, grace_s: float = 10.0) -> None:
    """SIGTERM then SIGKILL every process rooted at ``root``, by pid; raise if any survive."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        pids = processes_in(root)
        if not pids:
            return
        log.info("sending %s to %s", sig.name, ", ".join(f"{p}({process_name(p)})" for p in pids))
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if not wait_gone(root, wait_s):
            return
    left = processes_in(root)
    if left:
        raise PoolError(f"processes still running in {root}: {left}")
