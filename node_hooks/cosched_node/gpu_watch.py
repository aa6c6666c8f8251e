"""The node agent's GPU side (issue 13): whether a GPU claim may start, each job's GPU memory
from nvidia-smi, and the node's MPS control daemon.

Runs as ROOT inside the agent. A claim's GPUs and their shares come from the startd's slot
view (``Claim.gpus``), each GPU's memory and uuid from the root-owned node config, each
process's GPU memory from nvidia-smi (the driver's account), and which job a process is from
/proc (descendants of the claim's starter): nothing a job writes sizes a limit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Callable, Dict, Iterable, List, Optional, Sequence

from cosched_node import gpus
from cosched_node.config import NodeConfig
from cosched_node.procs import Proc
from cosched_node.slots import Claim

NVIDIA_SMI_APPS = ("--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits")
MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_COMM = MPS_CONTROL[:15]     # /proc/<pid>/comm keeps 15 characters
QUERY_TIMEOUT_S = 20.0
Log = Callable[[str], None]


def start_problem(config: NodeConfig, claim: Claim, others: Iterable[Claim]) -> Optional[str]:
    """Why ``claim`` may not start beside the live claims ``others`` on its GPUs, or None:
    a GPU index the node does not have, the GPU's memory or compute (``config.gpu_compute``,
    1000 times the overcommit factor) exceeded by the claims' allocations (HTCondor's
    accounting makes this impossible unless the ads were stale or the config changed), a
    whole-GPU claim (1000 or more of a GPU) on a GPU that is not idle or a claim on a GPU a
    whole-GPU claim holds (on an overcommitted node the GPU's compute would leave room), or a
    GPU shared by two Owners (MPS runs one server per Linux user; a client of a second user
    waits until the first user's clients all exit) unless the node config says all jobs run
    under one execute account."""
    others = list(others)
    for share in claim.gpus:
        gpu = config.gpu(share.index)
        if gpu is None:
            return f"GPU {share.index} is not a GPU of node {config.node}"
        mates = [o for o in others if any(s.index == share.index for s in o.gpus)]
        held = [s for o in mates for s in o.gpus if s.index == share.index]
        used = sum(s.memory_mb for s in held)
        if used + share.memory_mb > gpu.memory_mb:
            return f"GPU {share.index} memory {used}+{share.memory_mb} MB > {gpu.memory_mb} MB"
        computing = sum(s.compute for s in held)
        if computing + share.compute > config.gpu_compute:
            return f"GPU {share.index} compute {computing}+{share.compute} > {config.gpu_compute}"
        if held and max(s.compute for s in (share, *held)) >= gpus.WHOLE_GPU_COMPUTE:
            return f"GPU {share.index} is held whole by one job, not shared (compute {computing}+{share.compute})"
        strangers = sorted({o.remote_user for o in mates if o.remote_user != claim.remote_user})
        if strangers and not config.single_account:
            return (f"GPU {share.index} runs jobs of {strangers[0][:60]}, not {claim.remote_user[:60]} "
                    "(MPS: one user per GPU)")
    return None


def allowed_by_uuid(config: NodeConfig, claim: Claim) -> Dict[str, int]:
    """The GPU memory (MB) ``claim`` holds on each GPU, by the GPU's uuid."""
    out: Dict[str, int] = {}
    for share in claim.gpus:
        gpu = config.gpu(share.index)
        if gpu is not None:
            out[gpu.uuid] = share.memory_mb
    return out


class NvidiaSmi:
    """``nvidia-smi --query-compute-apps`` (list argv, no shell); None when it fails, logged once
    per cause."""

    def __init__(self, command: str, log: Log) -> None:
        self.command, self.log = command, log
        self._problem: Optional[str] = None

    def apps(self) -> Optional[List[gpus.ComputeApp]]:
        try:
            out = subprocess.run([self.command, *NVIDIA_SMI_APPS], stdin=subprocess.DEVNULL, capture_output=True,
                                 timeout=QUERY_TIMEOUT_S, check=False)
            if out.returncode != 0:
                raise gpus.GpuError(f"{self.command} exited {out.returncode}")
            apps = gpus.parse_compute_apps(out.stdout[:1 << 22].decode("utf-8", "replace"))
        except (OSError, subprocess.SubprocessError, gpus.GpuError) as exc:
            problem = f"GPU memory not watched this interval: {exc}"
            if problem != self._problem:
                self.log(problem)
            self._problem = problem
            return None
        self._problem = None
        return apps


def find_command(option: Optional[str], default: str) -> Optional[str]:
    """An executable: ``option`` ('' none, 'auto' or None the default looked up on PATH)."""
    if option == "":
        return None
    return shutil.which(default if option in (None, "auto") else option)


class MpsControl:
    """Keeps one MPS control daemon on the node (``nvidia-cuda-mps-control -d``), its pipes
    and logs in the node config's root-owned directories."""

    def __init__(self, command: str, pipe_directory: str, log_directory: str, log: Log) -> None:
        self.command, self.pipe_directory, self.log_directory, self.log = command, pipe_directory, log_directory, log

    def running(self, table: Dict[int, Proc]) -> bool:
        return any(p.comm == MPS_COMM and p.uid == 0 for p in table.values())

    def ensure(self, table: Dict[int, Proc]) -> None:
        if self.running(table):
            return
        try:
            for path in (self.pipe_directory, self.log_directory):
                os.makedirs(path, mode=0o755, exist_ok=True)
            env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CUDA_MPS_PIPE_DIRECTORY": self.pipe_directory,
                   "CUDA_MPS_LOG_DIRECTORY": self.log_directory}
            out = subprocess.run([self.command, "-d"], stdin=subprocess.DEVNULL, capture_output=True,
                                 timeout=QUERY_TIMEOUT_S, check=False, env=env)
            self.log(f"MPS control daemon started ({self.command} -d exited {out.returncode}), pipes in "
                     f"{self.pipe_directory}")
        except (OSError, subprocess.SubprocessError) as exc:
            self.log(f"MPS control daemon not started: {exc}")


def stop_reason(used: Dict[str, int], allowed: Dict[str, int], uuids: Sequence[str]) -> Optional[str]:
    """The message of a GPU memory stop, or None when the job is within its claim."""
    over = gpus.over_memory(used, allowed)
    if not over:
        return None
    index = {u: k for k, u in enumerate(uuids)}
    return "; ".join(f"GPU memory use {u} MB on GPU {index.get(uuid, '?')} ({uuid}) exceeds its allocation of {a} MB"
                     for uuid, u, a in over)
