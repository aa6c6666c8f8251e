#!/usr/bin/python3 -Es
"""A fake ``nvidia-smi`` for the local test pool's GPU nodes (no GPU on our machines).

Answers the two queries the node programs run, so discovery and the node agent take their
real code paths:

- ``--query-gpu=index,uuid,name,memory.total,compute_cap --format=csv,noheader[,nounits]``
  from the node config's ``gpus`` (root-written);
- ``--query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader[,nounits]`` from the
  files in ``--apps-dir``: a file named ``<pid>`` holding ``<gpu uuid> <MiB>`` lines says that
  process uses that much memory on that GPU; only pids alive in /proc are reported.

The apps dir is job-writable by necessity: a test job declares there the GPU memory its CUDA
calls would have taken on real hardware. It is test input, never a limit: the agent takes
each job's limit from its claim, and a process of one job cannot pose as another's (the
agent maps pids to jobs through /proc). Never install this on a real node.
"""
import argparse
import json
import os
import re
import sys

GPU_FIELDS = {"index", "uuid", "name", "memory.total", "compute_cap"}
APP_FIELDS = {"pid", "gpu_uuid", "used_memory"}


def gpu_rows(config_path, fields, units):
    with open(config_path, encoding="utf-8") as f:
        gpus = json.load(f).get("gpus") or []
    for k, g in enumerate(gpus):
        values = {"index": str(k), "uuid": g["uuid"], "name": g["model"],
                  "memory.total": f"{g['memory_mb']}{' MiB' if units else ''}", "compute_cap": f"{g['capability']:.1f}"}
        yield [values[f] for f in fields]


def app_rows(apps_dir, fields, units):
    try:
        names = sorted(os.listdir(apps_dir))
    except OSError:
        return
    for name in names:
        if not re.match(r"^\d{1,7}$", name) or not os.path.exists(f"/proc/{name}"):
            continue
        try:
            with open(os.path.join(apps_dir, name), encoding="ascii", errors="replace") as f:
                lines = f.read(4096).splitlines()
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) != 2 or not parts[1].isdigit():
                continue
            values = {"pid": name, "gpu_uuid": parts[0], "used_memory": f"{parts[1]}{' MiB' if units else ''}"}
            yield [values[f] for f in fields]


def main(argv=None):
    ap = argparse.ArgumentParser(description="fake nvidia-smi (test pools only)")
    ap.add_argument("--node-config", required=True)
    ap.add_argument("--apps-dir", required=True)
    ap.add_argument("--query-gpu")
    ap.add_argument("--query-compute-apps")
    ap.add_argument("--format", default="csv")
    args = ap.parse_args(argv)
    fmt = set(args.format.split(","))
    units = "nounits" not in fmt
    if "csv" not in fmt:
        print("fake nvidia-smi: only --format=csv", file=sys.stderr)
        return 2
    if args.query_gpu:
        fields, allowed, rows = args.query_gpu.split(","), GPU_FIELDS, gpu_rows
        source = args.node_config
    elif args.query_compute_apps:
        fields, allowed, rows = args.query_compute_apps.split(","), APP_FIELDS, app_rows
        source = args.apps_dir
    else:
        print("fake nvidia-smi: only --query-gpu and --query-compute-apps", file=sys.stderr)
        return 2
    if not set(fields) <= allowed:
        print(f"fake nvidia-smi: fields {sorted(set(fields) - allowed)} not supported", file=sys.stderr)
        return 2
    if "noheader" not in fmt:
        print(", ".join(fields))
    for row in rows(source, fields, units):
        print(", ".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
