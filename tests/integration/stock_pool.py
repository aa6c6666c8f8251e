"""A stock HTCondor pool for the admin's documented path: Debian's minicondor configuration
(``00-minicondor``, ``00-security``: recommended security), a site file of its own, and
nothing of ``condor-sched pool up``'s layout.

It runs in a copy-on-write overlay of a cached Debian sid chroot (``stock-root``, never run
in, so every run starts from a fresh install) and in a network namespace of its own, so its
daemons take HTCondor's stock ports beside the session's test pool. Two hosts:

- ``vm.stock.test`` (the host's own name): central manager, schedd, the sidecar's host, and
  three startds by local name (NODE1 ``dev1``, NODE2 ``gpu1``, NODE3 ``sns1``): the site's
  own several-startds configuration, as an admin writes it;
- ``plain.stock.test``: a second condor_master with one startd that gets none of
  condor_sched's snippets and keeps HTCondor's native GPU allocation (``use feature:GPUs``,
  two simulated GPUs).

The hardware condor_sched discovers is the test's: a sysfs of 2 sockets x 8 cores with their
L3 cache ids, a resctrl mount (20 ways), a ``micinfo`` of one Xeon Phi card and a fake
``nvidia-smi`` of two H100 GPUs (Capability 9.0) whose per-process memory a job declares.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from condor_sched import resources
from condor_sched.localpool import chroot

DOMAIN = "stock.test"
PLAIN_HOST = f"plain.{DOMAIN}"
#: Local name, startd name, role overrides of each startd of the main host.
STARTDS = (("NODE1", "dev1", "role = device\ndevice_host_cores = 4\nmem_bw_gbs = 68.5\n"),
           ("NODE2", "gpu1", "role = gpu\n"),
           ("NODE3", "sns1", "role = socket\nmem_bw_gbs = 68.5\n"))
#: One model per GPU node (the sidecar plans no node of several models).
GPUS = tuple({"uuid": f"GPU-7e57a0c1-0000-4000-8000-00000000000{k}", "model": "NVIDIA H100", "memory_mb": 81559,
              "capability": 9.0} for k in range(2))
#: Where a job declares the GPU memory its process uses (``<pid>`` holding ``<uuid> <MiB>``).
GPU_APPS_DIR = "/srv/fake-gpu-apps"
MICINFO = ("MicInfo Utility Log\n\nDevice No: 0, Device Name: mic0\n\n\tCores\n"
           "\t\tTotal No of Active Cores : 61\n\tGDDR\n\t\tGDDR Size\t\t : 15872 MB\n")
USER, UID = "alice", 2001
CLEAN = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "HOME=/root"]

SITE_CONFIG = f"""# The site's own configuration (not condor_sched's): this host's name and address, and
# three startds by local name, each a node of its own name.
CONDOR_HOST = 127.0.0.1
NETWORK_INTERFACE = 127.0.0.1
ENABLE_IPV6 = False
UID_DOMAIN = {DOMAIN}
DAEMON_LIST = MASTER, COLLECTOR, NEGOTIATOR, SCHEDD, SHARED_PORT, {", ".join(s[0] for s in STARTDS)}
""" + "".join(f"""{local} = $(STARTD)
{local}_ARGS = -local-name {local}
{local}.STARTD_NAME = {name}
{local}.NETWORK_HOSTNAME = {name}.{DOMAIN}
{local}.STARTD_LOG = $(LOG)/StartLog.{name}
{local}.EXECUTE = $(LOCAL_DIR)/lib/condor/execute/{name}
""" for local, name, _ in STARTDS)

PLAIN_CONFIG = f"""# A second execute host: stock, no condor_sched snippet, HTCondor's own GPU allocation.
RELEASE_DIR = /usr
LOCAL_DIR = /var/lib/condor-plain
LOG = $(LOCAL_DIR)/log
SPOOL = $(LOCAL_DIR)/spool
EXECUTE = $(LOCAL_DIR)/execute
LOCK = $(LOCAL_DIR)/lock
RUN = $(LOCAL_DIR)/run
CRED_STORE_DIR = $(LOCAL_DIR)/cred_dir
ETC = /etc/condor
BIN = $(RELEASE_DIR)/bin
SBIN = $(RELEASE_DIR)/sbin
LIB = $(RELEASE_DIR)/lib/condor
LIBEXEC = $(RELEASE_DIR)/libexec/condor
SHARE = $(RELEASE_DIR)/share/condor
LOCAL_CONFIG_DIR = /etc/condor-plain/config.d
CONDOR_HOST = 127.0.0.1
NETWORK_INTERFACE = 127.0.0.1
NETWORK_HOSTNAME = {PLAIN_HOST}
ENABLE_IPV6 = False
UID_DOMAIN = {DOMAIN}
USE_SHARED_PORT = False
# Two masters on one machine would share a "family" security session; separate hosts do not.
SEC_USE_FAMILY_SESSION = False
use ROLE : Execute
use SECURITY : recommended
use feature : GPUs
GPU_DISCOVERY_EXTRA = $(GPU_DISCOVERY_EXTRA) -simulate:2,2
UPDATE_INTERVAL = 5
STARTER_UPDATE_INTERVAL = 5
RUNBENCHMARKS = 0
"""


class StockPoolError(RuntimeError):
    pass


@dataclass
class StockPool:
    cache_dir: Path = field(default_factory=lambda: chroot_cache_dir())
    netns: str = f"cosched-stock-{os.getpid()}"
    #: The wheel the admin installs (set by :meth:`up`).
    wheel: Path | None = None

    @property
    def base(self) -> Path:
        return self.cache_dir / "stock-root"

    @property
    def root(self) -> Path:
        return self.cache_dir / "stock-run"

    @property
    def layers(self) -> Path:
        return self.cache_dir / "stock-overlay"

    @property
    def wheelhouse(self) -> Path:
        return self.cache_dir / "stock-wheelhouse"

    @property
    def host(self) -> str:
        return socket.gethostname().split(".")[0].lower()

    def inside(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    # --- commands -------------------------------------------------------------------------

    def run(self, script: str, *, user: str | None = None, env: dict[str, str] | None = None,
            config: str | None = None, timeout_s: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        """``sh -ec script`` in the chroot, in the pool's network namespace, as root (or ``user``)."""
        extra = [f"{k}={v}" for k, v in (env or {}).items()] + ([f"CONDOR_CONFIG={config}"] if config else [])
        shell = ["/bin/sh", "-ec", script]
        if user:
            shell = ["runuser", "-u", user, "--", *shell]
        cmd = ["nsenter", f"--net=/run/netns/{self.netns}", "env", "-i", *CLEAN, *extra,
               "chroot", str(self.root), *shell]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        if check and proc.returncode != 0:
            raise StockPoolError(f"exit {proc.returncode}:\n--- script\n{script}\n--- stdout\n{proc.stdout[-4000:]}"
                                 f"\n--- stderr\n{proc.stderr[-4000:]}")
        return proc

    # --- up and down -----------------------------------------------------------------------

    def build_base(self) -> None:
        if not chroot.is_built(self.base):
            chroot.build_root(self.base, USER, UID)

    def up(self, wheel: Path) -> None:
        """A fresh overlay of the stock root with the test's hardware and site files, its
        wheelhouse, both masters started (the main host with its stock config and site file)."""
        self.wheel = wheel
        if chroot.mounts_under(self.root) or chroot.processes_in(self.root):
            raise StockPoolError(f"{self.root} is in use (a stock pool left running?)")
        if shutil.which("ip") is None or shutil.which("nsenter") is None:
            chroot.run(["apt-get", "install", "-y", "iproute2", "util-linux"],
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        shutil.rmtree(self.layers, ignore_errors=True)
        (self.layers / "upper").mkdir(parents=True)
        (self.layers / "work").mkdir()
        self.root.mkdir(exist_ok=True)
        chroot.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={self.base},upperdir={self.layers / 'upper'},workdir={self.layers / 'work'}",
                    str(self.root)])
        chroot.mount_root(self.root)
        self._hardware()
        self._wheelhouse(wheel)
        chroot.run(["ip", "netns", "add", self.netns])
        chroot.run(["ip", "-n", self.netns, "link", "set", "lo", "up"])
        self._site_files()
        shutil.copyfile(wheel, self.inside(f"/root/dist/{wheel.name}"))
        self.run("condor_master")
        self.run("condor_master", config="/etc/condor-plain/condor_config")

    def down(self) -> None:
        """Stop both masters, every process left in the root (by pid), unmount, drop the netns."""
        if Path(f"/run/netns/{self.netns}").exists():
            for config in (None, "/etc/condor-plain/condor_config"):
                self.run("condor_off -fast -master", config=config, check=False, timeout_s=60)
        chroot.wait_gone(self.root, 30)
        chroot.stop_processes(self.root)
        chroot.unmount_all(self.root)
        if Path(f"/run/netns/{self.netns}").exists():
            chroot.run(["ip", "netns", "delete", self.netns])
        shutil.rmtree(self.layers, ignore_errors=True)

    # --- what the admin's hosts are ---------------------------------------------------------

    def _hardware(self) -> None:
        sysfs = self.inside("/sys")
        chroot.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "stock-sysfs", str(sysfs)])
        for cpu in range(16):
            d = sysfs / f"devices/system/cpu/cpu{cpu}"
            for rel, value in (("online", 1), ("topology/physical_package_id", cpu // 8),
                               ("topology/core_id", cpu % 8), ("cache/index3/level", 3),
                               ("cache/index3/id", cpu // 8)):
                (d / rel).parent.mkdir(parents=True, exist_ok=True)
                (d / rel).write_text(f"{value}\n")
        resctrl = sysfs / "fs/resctrl"
        resctrl.mkdir(parents=True)
        chroot.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "stock-resctrl", str(resctrl)])
        (resctrl / "info/L3").mkdir(parents=True)
        (resctrl / "info/L3/cbm_mask").write_text("fffff\n")
        (resctrl / "info/L3/num_closids").write_text("16\n")
        (resctrl / "schemata").write_text("L3:0=fffff;1=fffff\n")
        (resctrl / "tasks").write_text("")
        fakes = self.inside("/opt/stock-test-hardware")
        fakes.mkdir(parents=True)
        shutil.copyfile(resources.node_hooks_dir() / "fake_nvidia_smi.py", fakes / "fake_nvidia_smi.py")
        (fakes / "gpus.json").write_text(json.dumps({"gpus": list(GPUS)}))
        (fakes / "micinfo.txt").write_text(MICINFO)
        _script(self.inside("/usr/bin/nvidia-smi"),
                "exec /usr/bin/python3 -Es /opt/stock-test-hardware/fake_nvidia_smi.py "
                f"--node-config /opt/stock-test-hardware/gpus.json --apps-dir {GPU_APPS_DIR} \"$@\"")
        _script(self.inside("/usr/bin/micinfo"), "exec cat /opt/stock-test-hardware/micinfo.txt")
        apps = self.inside(GPU_APPS_DIR)
        apps.mkdir(parents=True)
        apps.chmod(0o1777)

    def _site_files(self) -> None:
        names = " ".join(f"{name}.{DOMAIN}" for _, name, _ in STARTDS)
        full = socket.gethostname() if socket.gethostname().lower() != self.host else ""
        self.inside("/etc/hosts").write_text(f"127.0.0.1 {self.host}.{DOMAIN} {self.host} {full}\n127.0.0.1 localhost\n"
                                             f"127.0.0.1 {names} {PLAIN_HOST}\n")
        self.inside("/etc/condor/config.d/01-site.conf").write_text(SITE_CONFIG)
        self.inside("/etc/condor-plain/config.d").mkdir(parents=True)
        self.inside("/etc/condor-plain/condor_config").write_text(PLAIN_CONFIG)
        dirs = ["/var/lib/condor/execute", *[f"/var/lib/condor/execute/{n}" for _, n, _ in STARTDS],
                *[f"/var/lib/condor-plain/{d}" for d in ("", "log", "spool", "execute", "lock", "run", "cred_dir")]]
        self.run("for d in " + " ".join(dirs) + "; do mkdir -p $d; chown condor:condor $d; done")
        self.inside("/root/dist").mkdir(parents=True, exist_ok=True)

    def _wheelhouse(self, wheel: Path) -> None:
        """The wheel's dependencies for the chroot's Python, downloaded once (with the host's
        network and CA bundle, as the local pool's venv is built) and kept between runs: the
        pool's namespace has no network, so the admin's ``pip install`` reads them from
        there (``PIP_FIND_LINKS``), as on an air-gapped host."""
        requires = sorted(line.split(":", 1)[1].strip() for line in _metadata(wheel).splitlines()
                          if line.startswith("Requires-Dist:") and "extra ==" not in line)
        stamp = hashlib.sha256("\n".join(requires).encode()).hexdigest()
        self.wheelhouse.mkdir(exist_ok=True)
        target = self.inside("/var/cache/wheelhouse")
        target.mkdir(parents=True, exist_ok=True)
        chroot.bind(self.wheelhouse, target)
        if (self.wheelhouse / ".stamp").is_file() and (self.wheelhouse / ".stamp").read_text() == stamp:
            return
        if Path("/etc/resolv.conf").is_file():
            shutil.copyfile("/etc/resolv.conf", self.inside("/etc/resolv.conf"))
        cert = []
        if Path(chroot.HOST_CA_SOURCE).is_file():
            shutil.copyfile(chroot.HOST_CA_SOURCE, self.inside("/root/host-ca.crt"))
            cert = ["--cert", "/root/host-ca.crt"]
        chroot.in_chroot(self.root, ["python3", "-m", "venv", "/root/download-venv"])
        chroot.in_chroot(self.root, ["/root/download-venv/bin/pip", "download", "--quiet", "--disable-pip-version-check",
                                     *cert, "--dest", "/var/cache/wheelhouse", *requires], timeout_s=1200)
        (self.wheelhouse / ".stamp").write_text(stamp)


def chroot_cache_dir() -> Path:
    from condor_sched import localpool

    return localpool.PoolSettings.from_env().cache_dir


def _metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return z.read(name).decode()


def _script(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def build_wheel(out: Path) -> Path:
    """The wheel, built from this checkout as docs/admin.md says (``pip wheel . --no-deps``)."""
    src = resources.source_checkout()
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src),
                    "--no-deps", "--quiet", "-w", str(out)], check=True, capture_output=True, timeout=300)
    wheels = sorted(out.glob("condor_sched-*.whl"))
    if len(wheels) != 1:
        raise StockPoolError(f"expected one wheel in {out}, found {wheels}")
    return wheels[0]


# --- docs/admin.md and docs/users.md as they are -------------------------------------------

@dataclass(frozen=True)
class Block:
    headings: tuple[str, ...]
    language: str
    text: str

    @property
    def section(self) -> str:
        return self.headings[-1] if self.headings else ""


def code_blocks(markdown: str) -> list[Block]:
    """Every fenced code block of a page, with the headings above it (indented fences too)."""
    blocks, headings, fence, lines, indent = [], [], None, [], 0
    for line in markdown.splitlines():
        stripped = line.strip()
        if fence is None:
            heading = re.match(r"^(#{1,6})\s+(.*)$", line)
            if heading:
                level = len(heading.group(1))
                headings = headings[:level - 1] + [heading.group(2).strip()]
            opening = re.match(r"^```(\w*)$", stripped)
            if opening:
                fence, lines, indent = opening.group(1), [], len(line) - len(line.lstrip())
            continue
        if stripped == "```":
            blocks.append(Block(tuple(h for h in headings if h), fence, "\n".join(lines) + "\n"))
            fence = None
            continue
        lines.append(line[indent:] if line[:indent].strip() == "" else line)
    return blocks


def wait_for(what: str, probe, timeout_s: float, interval_s: float = 2.0):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"{what}: not within {timeout_s} s (last: {last!r})")
