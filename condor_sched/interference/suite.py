"""The interference suite: small programs of distinct behaviour, and building them.

Paper 004 measures the NAS Parallel Benchmarks (classes A-D) and a matrix multiply (Table 1,
Section 4.1); a node of ours has two vCPUs and minutes, not hours, per program, so the suite is
small C kernels (``kernels.c``), each one behaviour an HPC code spends its time in. A program
is a kernel at a working-set size (like the paper's classes) and, for the interactive ones,
a think time (Section 5.2, Listing 1).

The Bubble-Up probes (Mars et al., MICRO 2011) need a "bubble" whose pressure on the shared
cache and memory bandwidth grows with its size: the ``stream`` kernel over ``BUBBLE_SIZES_KIB``
(cache-resident at the smallest, past the last-level cache at the largest); a program's
slowdown beside each size is its sensitivity. They also need a *reporter*, a program
sensitive to that pressure (pointer chasing over an LLC-resident set): its slowdown beside a
program, read off its slowdown beside each bubble size, gives the bubble size the program
equals (its pressure).

The ``FILLER`` holds the other vCPU whenever a run would leave it idle (a program alone, or two
programs time-sharing one vCPU): it computes in registers and touches no memory, so it slows
no one, and every run sees the host the same way. On a VM an idle vCPU is not neutral: in our
first measurement, without the filler, memory-bound programs ran 10-20% slower alone than
beside a compute-bound neighbour (most likely the host lends an idle vCPU's core to others).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path


class BuildError(RuntimeError):
    """The kernels could not be built (no C compiler, or it failed)."""


@dataclass(frozen=True)
class Program:
    """One program of the suite: a kernel of ``kernels.c`` at a working-set size."""

    name: str
    kernel: str
    size_kib: int
    think_ms: float = 0.0
    behaviour: str = ""

    def argv(self, binary: Path, warmup_s: float, window_s: float) -> list[str]:
        return [str(binary), self.kernel, str(self.size_kib), f"{warmup_s:g}", f"{window_s:g}", f"{self.think_ms:g}"]


MiB = 1024
SUITE: tuple[Program, ...] = (
    Program("fma", "fma", 4, behaviour="compute-bound, floating point, registers only"),
    Program("intmix", "intmix", 4, behaviour="compute-bound, integer multiply-xorshift chain"),
    Program("mm", "mm", 768, behaviour="dense matrix multiply (the paper's mm), L2-resident"),
    Program("sweep-l1", "sweep", 32, behaviour="sequential sums over an L1-resident array"),
    Program("sweep-l2", "sweep", 512, behaviour="sequential sums over an L2-resident array"),
    Program("random-llc", "random-read", 8 * MiB, behaviour="independent random reads, LLC-resident"),
    Program("chase-llc", "chase", 4 * MiB, behaviour="pointer chasing, LLC-resident (latency)"),
    Program("chase-dram", "chase", 64 * MiB, behaviour="pointer chasing past the LLC (DRAM latency)"),
    Program("stream", "stream", 96 * MiB, behaviour="STREAM triad (memory bandwidth)"),
    Program("copy", "copy", 64 * MiB, behaviour="memcpy through a large buffer (bandwidth)"),
    Program("stencil", "stencil", 32 * MiB, behaviour="5-point Jacobi stencil (multigrid-like)"),
    Program("spmv", "spmv", 16 * MiB, behaviour="sparse matrix-vector product (cg-like, irregular)"),
    Program("branchy", "branchy", 64, behaviour="unpredictable multi-way branches"),
    Program("sort", "sort", 128, behaviour="qsort of random integers (branches, L2)"),
    Program("alloc", "alloc", 64, behaviour="malloc/free of mixed sizes (allocation-heavy)"),
    Program("pagefault", "pagefault", 64, behaviour="mmap, touch, munmap (page faults, kernel time)"),
    Program("mixed", "mixed", 48 * MiB, behaviour="alternating compute and streaming phases"),
    Program("interactive-llc", "random-read", 8 * MiB, think_ms=20.0,
            behaviour="LLC-resident reads in 10 ms bursts with 20 ms think time (interactive)"),
)
BUBBLE_KERNEL = "stream"
BUBBLE_SIZES_KIB: tuple[int, ...] = (2 * MiB, 8 * MiB, 32 * MiB, 128 * MiB)
REPORTER = Program("reporter", "chase", 4 * MiB, behaviour="Bubble-Up reporter: LLC-resident pointer chasing")
FILLER = Program("filler", "fma", 4, behaviour="holds an otherwise idle vCPU; registers only")
#: The two-kernel suite of the smoke test (CI) and of ``measure --smoke``.
SMOKE_SUITE: tuple[Program, ...] = (
    Program("fma", "fma", 4, behaviour="compute-bound"),
    Program("stream-small", "stream", 8 * MiB, behaviour="streaming, LLC-resident"),
)
SMOKE_BUBBLE_SIZES_KIB: tuple[int, ...] = (1 * MiB, 32 * MiB)


def bubble(size_kib: int) -> Program:
    """The Bubble-Up bubble of a size."""
    return Program(f"bubble-{size_kib // MiB}m" if size_kib >= MiB else f"bubble-{size_kib}k",
                   BUBBLE_KERNEL, size_kib, behaviour="Bubble-Up pressure bubble")


def kernel_source() -> bytes:
    return files("condor_sched.interference").joinpath("kernels.c").read_bytes()


def build_kernels(cache_dir: Path, compiler: str | None = None) -> Path:
    """The kernels' binary, compiled once per source and compiler into ``cache_dir``."""
    source = kernel_source()
    cc = compiler or os.environ.get("CC") or "cc"
    cc_path = shutil.which(cc)
    if cc_path is None:
        raise BuildError(f"no C compiler {cc!r} on PATH: install gcc (Debian: apt-get install gcc) or set CC")
    digest = hashlib.sha256(source + cc_path.encode()).hexdigest()[:16]
    binary = cache_dir / f"cosched-kernels-{digest}"
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    src = cache_dir / f"kernels-{digest}.c"
    tmp = binary.with_suffix(".tmp")
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        src.write_bytes(source)
        done = subprocess.run([cc_path, "-O2", "-std=gnu11", "-o", str(tmp), str(src), "-lm"],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise BuildError(f"{cc_path} could not build the kernels:\n{done.stderr.strip()}")
        os.replace(tmp, binary)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(f"cannot build the kernels in {cache_dir}: {e}") from None
    return binary
