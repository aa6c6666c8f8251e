"""``perf stat`` samples for run records: IPC of a job's processes, and the node's memory
bandwidth from uncore IMC counters while the job runs alone (Section 4.2 of paper 000's
piggyback profiling). List argv and a timeout, never a shell; absent counters (our
machines have none) are logged once and the records go without them."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from typing import Callable, Dict, Optional, Sequence

Log = Callable[[str], None]


def parse_perf_csv(text: str) -> Dict[str, float]:
    """``perf stat -x ,`` output -> sums of instructions, cycles and IMC bytes read+written."""
    out = {"instructions": 0.0, "cycles": 0.0, "imc_bytes": 0.0}
    seen = set()
    for line in text.splitlines():
        fields = line.split(",")
        if len(fields) < 3 or line.startswith("#"):
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue   # <not counted>, <not supported>
        if not math.isfinite(value) or value < 0:
            continue
        unit, event = fields[1].strip(), fields[2].strip().lower()
        if "cas_count_read" in event or "cas_count_write" in event:
            scale = {"MiB": 1048576.0, "MB": 1e6, "KiB": 1024.0, "B": 1.0}.get(unit, 64.0)
            out["imc_bytes"] += value * scale
            seen.add("imc_bytes")
        elif "instructions" in event:
            out["instructions"] += value
            seen.add("instructions")
        elif re.search(r"(^|[/:])cycles([/:]|$)|^cpu-cycles", event):
            out["cycles"] += value
            seen.add("cycles")
    return {key: value for key, value in out.items() if key in seen}


class PerfSampler:
    """``perf stat`` of a job's processes (IPC) and of the node (IMC bandwidth); list argv
    and a timeout, never a shell."""

    def __init__(self, perf: str, seconds: float, log: Log) -> None:
        self.perf = perf
        self.seconds = seconds
        self.log = log
        self.sleep = shutil.which("sleep", path="/usr/bin:/bin") or "/bin/sleep"
        self.bandwidth_ok = True
        self.ipc_ok = True

    def sample(self, pids: Sequence[int], node_wide: bool) -> Dict[str, float]:
        if not pids or not self.ipc_ok:
            return {}
        secs = "%.3f" % self.seconds
        runs = [("ipc", [self.perf, "stat", "-x", ",", "-e", "instructions,cycles",
                         "-p", ",".join(str(int(p)) for p in pids), "--", self.sleep, secs])]
        if node_wide and self.bandwidth_ok:
            runs.append(("bw", [self.perf, "stat", "-x", ",", "-a", "-e",
                                "uncore_imc/cas_count_read/,uncore_imc/cas_count_write/",
                                "--", self.sleep, secs]))
        procs = []
        for what, argv in runs:
            try:
                procs.append((what, subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                     stderr=subprocess.PIPE, close_fds=True)))
            except OSError as exc:
                self.log(f"perf not usable ({exc.strerror}): no IPC/bandwidth samples")
        out: Dict[str, float] = {}
        for what, proc in procs:
            try:
                stdout, stderr = proc.communicate(timeout=self.seconds + 10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                continue
            text = (stderr + b"\n" + stdout).decode("utf-8", "replace")
            parsed = parse_perf_csv(text)
            if what == "ipc":
                if parsed.get("cycles", 0) > 0 and "instructions" in parsed:
                    out["instructions"], out["cycles"] = parsed["instructions"], parsed["cycles"]
                elif "<not supported>" in text and self.ipc_ok:
                    self.ipc_ok = False
                    self.log("perf: instructions/cycles not supported here: IPC and bandwidth not recorded")
            elif what == "bw":
                if "imc_bytes" in parsed:
                    out["imc_bytes"], out["imc_seconds"] = parsed["imc_bytes"], self.seconds
                elif self.bandwidth_ok:
                    self.bandwidth_ok = False
                    self.log("perf: no uncore_imc CAS counters here: bandwidth not recorded")
        return out


def make_perf(option: str, seconds: float, log: Log) -> Optional[PerfSampler]:
    if option == "":
        return None
    path = shutil.which("perf", path="/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/bin") if option == "auto" else option
    if not path or not os.path.isfile(path) or not os.access(path, os.X_OK):
        if option != "auto":
            log(f"--perf {option}: not an executable: IPC/bandwidth not recorded")
        return None
    return PerfSampler(path, seconds, log)
