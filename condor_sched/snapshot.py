"""Queue and machine snapshots: files in the ``condor_q -json`` / ``condor_status -json`` format."""
from __future__ import annotations

from pathlib import Path

from condor_sched.classads import ads_to_json, state_from_snapshot
from condor_sched.model import PoolState

QUEUE_FILE = "queue.json"
MACHINES_FILE = "machines.json"


def load_snapshot(queue: str | Path, machines: str | Path) -> PoolState:
    """Records from snapshot files; raises SnapshotError for a file that does not parse."""
    return state_from_snapshot(queue, machines)


def write_snapshot(outdir: str | Path) -> tuple[Path, Path]:
    """Write every job of every schedd and every startd ad of the live pool."""
    from condor_sched import pool

    ads = pool.read_ads()
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    queue, machines = outdir / QUEUE_FILE, outdir / MACHINES_FILE
    queue.write_text(ads_to_json(ad for job_ads in ads.jobs.values() for ad in job_ads))
    machines.write_text(ads_to_json(ads.slots))
    return queue, machines
