"""The documented path is the tested path: a stock pool (Debian's minicondor configuration with
recommended security, three startds by local name on one host, a second host left stock)
enabled by running the shell blocks of docs/admin.md as they are, then the submit files of
docs/users.md submitted with condor_submit by an ordinary user.

What the test substitutes, and nothing else: the site values (assigned again after the page's
Site values block, as the page says), the one-host ``ssh``/``scp`` of the page's convention,
pip's wheelhouse (``PIP_FIND_LINKS``: the pool's network namespace has no network), each
startd's overrides file (the admin's site data), the hardware (see stock_pool.py), and each
submit file's executable (a short script of the same name in the job's directory).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from stock_pool import DOMAIN, GPU_APPS_DIR, GPUS, PLAIN_HOST, STARTDS, USER, StockPool, build_wheel, code_blocks, \
    wait_for

from condor_sched import __version__, resources
from condor_sched.localpool import chroot

pytestmark = pytest.mark.pool

DOCS = resources.source_checkout() / "docs"
#: Enabling is every sh block before this section (after it: knobs, upgrade, turning it off).
ENABLING_ENDS_AT = "Knobs"
#: sh blocks of the enabling part this host does not run, and why.
NOT_RUN = {"Describe the node and its slots (every execute node)":
           "this host runs several startds: the block of 'Several startds on one host' instead",
           "Interference-aware placement (paper 004), any node":
           "measuring the suite takes half an hour on an idle node (tests/cli runs its smoke suite)"}
#: The upgrade's block for a one-startd node (the host runs the one for several startds).
ONE_STARTD_UPGRADE = "cosched_describe_node.py --check --overrides"
JOBS = Path("/home") / USER / "jobs"


def admin_blocks(after_enabling: bool = False) -> list:
    page = (DOCS / "admin.md").read_text()
    cut = page.index(f"\n## {ENABLING_ENDS_AT}\n")
    return code_blocks(page[cut:] if after_enabling else page[:cut])


def users_submit_files() -> dict[str, list[str]]:
    files: dict[str, list[str]] = {}
    for block in code_blocks((DOCS / "users.md").read_text()):
        if block.language == "submit":
            files.setdefault(block.section, []).append(block.text)
    return files


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the stock pool needs root")
    pool = StockPool()
    pool.build_base()
    wheel = build_wheel(tmp_path_factory.mktemp("wheel"))
    try:
        pool.up(wheel)
        yield pool
    finally:
        pool.down()
        assert chroot.processes_in(pool.root) == [] and chroot.mounts_under(pool.root) == []


@pytest.fixture(scope="module")
def enabled(stock: StockPool) -> dict[str, str]:
    return enable(stock)


def enable(stock: StockPool) -> dict[str, str]:
    """Run the page: every enabling sh block in order, each in a fresh root shell that first
    defines the one-host ssh/scp and runs the Site values block with the test's values."""
    stock.run("mkdir -p /etc/condor_sched/nodes")
    for _, name, role in STARTDS:
        stock.inside(f"/etc/condor_sched/nodes/{name}.ini").write_text(f"[node]\nnode = {name}\ndomain = {DOMAIN}\n{role}")
    wait_for("the stock pool's schedd", lambda: stock.run("condor_q -totals", check=False).returncode == 0, 90)
    blocks = [b for b in admin_blocks() if b.language == "sh" and b.section != "Site values"]
    assert len(blocks) >= 10, blocks
    return run_blocks(stock, [b for b in blocks if b.section not in NOT_RUN])


def run_blocks(stock: StockPool, blocks: list) -> dict[str, str]:
    """Each block in a fresh root shell that first defines the page's one-host ssh/scp and runs
    its Site values block, then the test's values; the output of each section."""
    page = admin_blocks()
    convention = next(b.text for b in page if b.language == "text" and "ssh() {" in b.text)
    site = next(b.text for b in page if b.section == "Site values" and b.language == "sh")
    host = f"{stock.host}.{DOMAIN}"
    values = (f"WHEEL=/root/dist/{stock.wheel.name}\nCM={host}\nSCHEDD_HOSTS={host}\nSIDECAR_HOST={host}\n"
              f"EXECUTE_NODES={host}\nSIDECAR_IDENTITY=condor@{DOMAIN}\n"
              f"STARTDS=\"{' '.join(local for local, _, _ in STARTDS)}\"\n")
    outputs: dict[str, str] = {}
    for block in blocks:
        out = stock.run(convention + site + values + block.text, timeout_s=600,
                        env={"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/var/cache/wheelhouse"})
        outputs[block.section] = outputs.get(block.section, "") + out.stdout + out.stderr
        if re.search(r"^\s*condor_restart\s*$", block.text, re.MULTILINE):
            wait_for(f"every startd back after condor_restart ({block.section})", lambda: _machines(stock) >= {
                PLAIN_HOST, *[f"{name}.{DOMAIN}" for _, name, _ in STARTDS]}, 120)
    return outputs


def _machines(stock: StockPool) -> set[str]:
    out = stock.run("condor_status -af Machine", check=False)
    return set(out.stdout.split()) if out.returncode == 0 else set()


def test_the_admin_page_enables_the_pool_and_its_check_shows_it_working(stock: StockPool, enabled: dict[str, str]):
    check = enabled["Check that it works"]
    assert re.search(r"^cosched@\S+ \S+ \d+", check, re.MULTILINE), check          # the sidecar's ad
    assert re.search(r"sidecar: cycle \d+: ", check), check                          # its log's lines

    def converted() -> set[str]:   # every converted startd: its config, this release and a live agent
        out = stock.run("condor_status -constraint 'CoSchedNodeConfigOK =?= true' "
                        "-af Machine CoSchedNodeVersion CoSchedNodeAgentAlive").stdout
        return {line.split()[0] for line in out.splitlines() if line.endswith(f" {__version__} true")}

    wait_for("every startd's node config, release and agent", lambda: converted() >= {
        f"{name}.{DOMAIN}" for _, name, _ in STARTDS}, 90)
    wait_for("the stock host's slot, left stock (no node config, HTCondor's two GPUs)", lambda: stock.run(
        f"condor_status -constraint 'Machine == \"{PLAIN_HOST}\"' -af CoSchedNodeConfigOK TotalGPUs"
    ).stdout.split() == ["undefined", "2"], 90)


def test_doctor_finds_nothing_wrong_on_the_host_and_each_of_its_startds(stock: StockPool, enabled: dict[str, str]):
    """As the admin page says: doctor as root on the host, then per startd by its local name."""
    for local in ["", *[f" --local-name {local}" for local, _, _ in STARTDS]]:
        out = stock.run(f"/opt/condor-sched/bin/condor-sched doctor{local}", check=False)
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.splitlines()[-1].endswith(", 0 problems"), out.stdout
        assert ("execute" in out.stdout.splitlines()[-1]) == bool(local), out.stdout


def _job_dir(stock: StockPool, name: str, submit: str, scripts: dict[str, str]) -> Path:
    d = JOBS / name
    host_dir = stock.inside(str(d))
    host_dir.mkdir(parents=True)
    (host_dir / "job.sub").write_text(submit)
    for file, body in scripts.items():
        (host_dir / file).write_text(body)
        (host_dir / file).chmod(0o755)
    stock.run(f"chown -R {USER}:{USER} {JOBS}")
    return d


def _submit(stock: StockPool, d: Path) -> int:
    out = stock.run(f"cd {d} && condor_submit job.sub", user=USER).stdout
    return int(re.search(r"submitted to cluster (\d+)", out).group(1))


def _queue(stock: StockPool, cluster: int) -> list[str]:
    """``condor_q -af:j CoSchedPinReason HoldReason`` lines of a cluster, as the user reads them."""
    out = stock.run(f"condor_q {cluster} -af:j JobStatus CoSchedPinReason HoldReason", user=USER).stdout
    return out.splitlines()


def _history(stock: StockPool, cluster: int, attrs: str) -> list[list[str]]:
    out = stock.run(f"condor_history {cluster} -af {attrs}", user=USER).stdout
    return [line.split() for line in out.splitlines() if line.strip()]


def test_users_submit_files_run_or_say_why_with_condor_q(stock: StockPool, enabled: dict[str, str]):
    files = users_submit_files()
    device_sub = files["Device jobs (Xeon Phi)"][0]
    share_sub, whole_sub = files["GPU shares and whole GPUs"][:2]
    spread_sub = files["Spread-n-Share (multi-process jobs)"][0]
    assert "queue 8" in device_sub and "Capability >= 9.0" in share_sub and "queue 16" in spread_sub
    sleep = "#!/bin/sh\nsleep 3\n"
    envfile = JOBS / "share" / "env"
    clusters = {
        "device": _submit(stock, _job_dir(stock, "device", device_sub, {"offload_km": sleep})),
        "share": _submit(stock, _job_dir(stock, "share", share_sub, {"train.py": (
            f"#!/bin/sh\necho \"$CUDA_VISIBLE_DEVICES $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE\" > {envfile}\nsleep 3\n")})),
        # the same share that uses 9000 MB of GPU memory where it asked 6000
        "over": _submit(stock, _job_dir(stock, "over", share_sub, {"train.py": (
            f"#!/bin/sh\necho \"$CUDA_VISIBLE_DEVICES 9000\" > {GPU_APPS_DIR}/$$\nexec sleep 600\n")})),
        "whole": _submit(stock, _job_dir(stock, "whole", whole_sub, {"train_big.py": sleep})),
        # a share whose model constraint no GPU of the pool meets
        "nomatch": _submit(stock, _job_dir(stock, "nomatch", share_sub.replace(">= 9.0", ">= 10.0"),
                                           {"train.py": sleep})),
        "spread": _submit(stock, _job_dir(stock, "spread", spread_sub, {"mg.x": sleep, "mg.input": ""})),
        # mixed pool: the stock host runs an ordinary job and a whole-GPU job as before
        "plain": _submit(stock, _job_dir(stock, "plain", (
            f"executable = /bin/sleep\narguments = 2\nrequirements = Machine == \"{PLAIN_HOST}\"\nqueue\n"), {})),
        "native": _submit(stock, _job_dir(stock, "native", (
            f"executable = gpu.sh\noutput = out\nrequest_GPUs = 1\nrequirements = Machine == \"{PLAIN_HOST}\"\n"
            "queue\n"), {"gpu.sh": "#!/bin/sh\necho \"$CUDA_VISIBLE_DEVICES\"\n"})),
    }
    done = {"device": 8, "share": 1, "whole": 1, "spread": 16, "plain": 1, "native": 1}

    def finished() -> bool:
        return all(len(_history(stock, clusters[k], "ExitCode")) == n for k, n in done.items())

    try:
        wait_for("every runnable job done", finished, 420, interval_s=5)
        held = wait_for("the job over its GPU memory held", lambda: [
            line for line in _queue(stock, clusters["over"]) if line.split()[1] == "5"], 180, interval_s=5)
    except AssertionError:
        print(stock.run("condor_q -allusers -af:j JobStatus CoSchedPinReason HoldReason LastRemoteHost; "
                        "tail -n 30 /var/log/condor/CoSchedLog", check=False).stdout)
        raise
    # Device jobs ran on the device startd's card, each where it was pinned.
    for exit_code, host, pin in _history(stock, clusters["device"], "ExitCode LastRemoteHost CoSchedPinSlot"):
        assert exit_code == "0" and host.split("@")[1] == "dev1" and pin.split("@")[1:] == host.split("@")[1:]
    # The share ran on one GPU, its MPS percentage its compute share; the whole-GPU job on both GPUs.
    uuid, percentage = stock.inside(str(envfile)).read_text().split()
    assert uuid in {g["uuid"] for g in GPUS} and percentage == "25"
    whole = _history(stock, clusters["whole"], "ExitCode LastRemoteHost CoSchedPinGPUs")[0]
    assert whole[0] == "0" and whole[1].split("@")[1] == "gpu1" and whole[2] == "0,1", whole
    # Spread-n-Share placed its 16 procs on socket slots, each where pinned; spread wider than one
    # node, the procs on each socket hold LLC ways and each proc bandwidth.
    spread = _history(stock, clusters["spread"], "ExitCode LastRemoteHost CoSchedPinSlot CoSchedPinScale "
                      "CoSchedPinLLCWays CoSchedPinMemBW")
    ways_per_socket: dict[str, int] = {}
    for exit_code, host, pin, scale, ways, bandwidth in spread:
        assert exit_code == "0" and pin.split("@")[1:] == host.split("@")[1:] and "_" not in pin, spread
        assert int(scale) == 1 or float(bandwidth) > 0, spread
        ways_per_socket[pin] = ways_per_socket.get(pin, 0) + int(ways)
    assert int(spread[0][3]) == 1 or min(ways_per_socket.values()) >= 1, spread
    print("Spread-n-Share scales:", sorted({s[3] for s in spread}), "nodes:", sorted({s[1].split("@")[1] for s in spread}))
    # The stock host ran its jobs, the GPU one on a GPU HTCondor assigned.
    assert _history(stock, clusters["plain"], "ExitCode LastRemoteHost")[0][1].endswith(PLAIN_HOST)
    native = _history(stock, clusters["native"], "ExitCode LastRemoteHost")[0]
    assert native[0] == "0" and native[1].endswith(PLAIN_HOST)
    assert stock.inside(str(JOBS / "native" / "out")).read_text().strip() not in ("", "10000")
    # The job over its GPU memory: held, with the limit and the use, readable with condor_q.
    assert "condor_sched: stopped on the execute node" in held[0] and "9000" in held[0] and "6000" in held[0], held
    # The share no GPU can take waits, and says why: its model constraint.
    nomatch = _queue(stock, clusters["nomatch"])
    assert nomatch and nomatch[0].split(None, 2)[1] == "1", nomatch
    assert "waiting: no usable GPU node has a GPU its model constraint accepts" in nomatch[0], nomatch


def test_the_page_upgrades_then_turns_it_off_and_jobs_get_their_submitted_requirements_back(
        stock: StockPool, enabled: dict[str, str]):
    """After the users' jobs (this module's order): the Upgrade blocks (the same wheel again),
    then Turning it off; the jobs left in the queue keep their submitted Requirements, a new
    co-scheduled job is no longer transformed, and no sidecar runs."""
    later = [b for b in admin_blocks(after_enabling=True) if b.language == "sh"]
    upgrade = [b for b in later if b.section == "Upgrade" and ONE_STARTD_UPGRADE not in b.text]
    off = [b for b in later if b.section == "Turning it off"]
    assert len(upgrade) == 3 and len(off) == 5, [b.section for b in later]
    upgraded = run_blocks(stock, upgrade)
    assert re.search(r"Successfully installed condor[-_]sched", upgraded["Upgrade"]), upgraded["Upgrade"]
    wait_for("the sidecar back after the upgrade", lambda: stock.run(
        "condor_status -any -constraint 'MyType == \"CoSchedSidecar\"' -af Name").stdout.strip(), 90)
    left = stock.run("condor_q -allusers -af:j CoSchedPinOriginalRequirements", user=USER).stdout.split("\n")
    left = [line.split()[0] for line in left if line.strip() and "undefined" not in line]
    assert left, "the users' test leaves jobs in the queue (held, waiting)"
    run_blocks(stock, off)
    assert stock.run("condor_status -any -constraint 'MyType == \"CoSchedSidecar\"' -af Name").stdout.strip() == ""
    for job in left:
        ad = stock.run(f"condor_q {job} -af:r Requirements CoSchedPinReason", user=USER).stdout
        assert "CoSchedPinSlot" not in ad and ad.rstrip().endswith("undefined"), ad
    files = users_submit_files()
    fresh = _submit(stock, _job_dir(stock, "after", files["Device jobs (Xeon Phi)"][0], {"offload_km": "#!/bin/sh\n"}))
    requirements = stock.run(f"condor_q {fresh} -af:r Requirements", user=USER).stdout
    assert "CoSchedPinSlot" not in requirements, requirements
