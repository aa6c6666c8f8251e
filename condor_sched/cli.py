"""The ``condor-sched`` command line: click commands, nothing else."""
from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import click

from condor_sched import report
from condor_sched.options import (
    MAX_AGE_CYCLES, MAX_GRANULARITY_MB, MAX_SOLVER_TIME_LIMIT_S, MIN_SOLVER_TIME_LIMIT_S, SEED,
    THREAD_OVERCOMMIT, BoundedFloat, bounded_int,
)
from condor_sched.classads import SnapshotError
from condor_sched.doctor_command import doctor
from condor_sched.interference.command import interference
from condor_sched.gc_pause import gc_paused
from condor_sched.modes.planning import PolicyError, PolicyKind
from condor_sched.modes.registry import get_policy, policy_names
from condor_sched.resources import default_snapshot_dir
from condor_sched.modes.registry import gpu_policy, gpu_policy_names
from condor_sched.settings import DEFAULT_GPU_POLICY, LIVE_NODE_POLICY, SettingsError, SidecarSettings

#: What the sidecar runs when no COSCHED_* knob says otherwise: plan, explain and simulate
#: decide with the same policies by default, so a snapshot plan is the sidecar's.
SIDECAR_DEFAULTS = SidecarSettings()

DEFAULT_SNAPSHOT = default_snapshot_dir()


class UsageFailure(click.ClickException):
    exit_code = 2


def _load_snapshot(queue: Path, machines: Path):
    from condor_sched.snapshot import load_snapshot

    try:
        return load_snapshot(queue, machines)
    except SnapshotError as e:
        raise UsageFailure(str(e)) from None


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log debug detail.")
def main(verbose: bool) -> None:
    """condor-sched: co-schedule HTCondor jobs on shared devices and nodes."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


snapshot_options = [
    click.option("--queue", "queue", type=click.Path(path_type=Path), default=DEFAULT_SNAPSHOT / "queue.json",
                 show_default=True, help="condor_q -json (or -long) file."),
    click.option("--machines", "machines", type=click.Path(path_type=Path),
                 default=DEFAULT_SNAPSHOT / "machines.json", show_default=True,
                 help="condor_status -json (or -long) file."),
]


def with_snapshot(f):
    for option in reversed(snapshot_options):
        f = option(f)
    return f



def gpu_policy_option(default: str) -> Callable[[Callable], Callable]:
    """``--gpu-policy``: the GPU jobs' policy (COSCHED_GPU_POLICY), any of ``gpu_policy_names()``."""
    return click.option("--gpu-policy", "gpu_policy_name", type=click.Choice(["none", *gpu_policy_names()]),
                        default=None,
                        help="GPU jobs' policy (COSCHED_GPU_POLICY): a fleet policy (fgd-mem-batch, fgd, best-fit, ...) "
                             f"or a device policy (knapsack, global, ...) on one device slot per GPU; default: {default}.")


@main.command()
@with_snapshot
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def show(queue: Path, machines: Path, as_json: bool) -> None:
    """Show idle jobs and the devices' free resources of a snapshot.

    Example: condor-sched show --queue queue.json --machines machines.json
    """
    state = _load_snapshot(queue, machines)
    if as_json:
        click.echo(json.dumps(report.state_json(state), indent=2, sort_keys=True))
    else:
        click.echo(report.state_text(state))


@main.command()
@with_snapshot
@click.option("--policy", default=SIDECAR_DEFAULTS.policy, show_default=True,
              type=click.Choice(policy_names() + gpu_policy_names(device_policies=False)),
              help="Planning policy (default: the sidecar's COSCHED_POLICY default); a spread policy (sns, sns-global, ce, cs) replaces --spread-policy, a GPU "
                   "policy (random-fit, best-fit, dot-product, gpu-packing, gpu-clustering, fgd) the GPU jobs' "
                   "(default: COSCHED_GPU_POLICY's default).")
@gpu_policy_option("COSCHED_GPU_POLICY's default")
@click.option("--spread-policy", default=SIDECAR_DEFAULTS.spread_policy, show_default=True, type=click.Choice(["none", *policy_names(PolicyKind.SPREAD)]),
              help="Policy for +CoSchedProgram jobs (COSCHED_SPREAD_POLICY); none leaves them.")
@click.option("--granularity-mb", type=bounded_int(1, MAX_GRANULARITY_MB), default=50, show_default=True,
              help="Device memory granularity of the knapsack.")
@click.option("--solver", type=click.Choice(["dp", "ortools"]), default="dp", show_default=True,
              help="Exact per-device knapsack solver.")
@click.option("--time-limit", type=BoundedFloat(MIN_SOLVER_TIME_LIMIT_S, MAX_SOLVER_TIME_LIMIT_S), default=2.0,
              show_default=True,
              help="CP-SAT time limit (s) of global policies.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the random policy.")
@click.option("--deterministic", is_flag=True,
              help="One CP-SAT worker and a deterministic time limit: the same plan on every run.")
@click.option("--thread-overcommit", type=THREAD_OVERCOMMIT, default=1.0, show_default=True,
              help="Device threads a plan may use, as a multiple of each device's threads (what-if: "
                   "a live pool accounts only the device compute its nodes advertise).")
@click.option("--unpin-age-cycles", type=bounded_int(1, MAX_AGE_CYCLES), default=3, show_default=True,
              help="Unpin a pin not matched within this many cycles (COSCHED_UNPIN_AGE_CYCLES).")
@click.option("--profiles", "profiles_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Spread-n-Share profile directory (default: the bundled profiles).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def plan(queue: Path, machines: Path, policy: str, gpu_policy_name: str | None, spread_policy: str, granularity_mb: int, solver: str,
         time_limit: float, seed: int, deterministic: bool, thread_overcommit: float, unpin_age_cycles: int,
         profiles_dir: Path | None, as_json: bool) -> None:
    """Decide one sidecar cycle on a queue snapshot offline (nothing is edited).

    Example: condor-sched plan --queue queue.json --machines machines.json --policy global --json

    The very cycle the sidecar runs: pins still fresh are kept (cycle numbers go on after
    the newest CoSchedPinCycle), stale ones unpinned, the rest planned. Device policies
    (knapsack, global, exclusive, random) place jobs that request device memory of a device
    kind (condor_sched.device_kinds: the Xeon Phi kind first); spread policies
    (sns, sns-global, ce, cs) place the procs of +CoSchedProgram jobs and add scale_factor,
    llc_ways and mem_bw_gbs to each assignment. Exit 0 when it planned (placed or not); 2 on bad input.
    """
    from condor_sched.cycle import CycleConfig, CycleMemory, decide_cycle
    from condor_sched.modes.planning import PlanSettings

    state = _load_snapshot(queue, machines)
    settings = PlanSettings(memory_granularity_mb=granularity_mb, knapsack_solver=solver,
                            solver_time_limit_s=time_limit, seed=seed, thread_overcommit=thread_overcommit,
                            deterministic=deterministic, spare_from_job_usage=True)
    spread = None if spread_policy == "none" else get_policy(spread_policy)
    config = CycleConfig(get_policy(SIDECAR_DEFAULTS.policy), spread, settings, unpin_age_cycles,
                         _profiles(profiles_dir), node_policy=get_policy(LIVE_NODE_POLICY),
                         gpu_policy=gpu_policy(DEFAULT_GPU_POLICY),
                         spare_policy=get_policy(SIDECAR_DEFAULTS.spare_policy)).with_policy(policy)
    if gpu_policy_name:
        config = config.with_gpu_policy(gpu_policy_name)
    with gc_paused():
        decision = decide_cycle(state, CycleMemory.fresh(state), config)
        if as_json:
            click.echo(json.dumps(decision.to_json(), indent=2, sort_keys=True))
        else:
            click.echo(report.decision_text(state, decision))


@main.command()
@click.argument("job_id", metavar="JOB")
@with_snapshot
@click.option("--live", is_flag=True, help="Read the live pool (CONDOR_CONFIG) instead of a snapshot.")
@click.option("--policy", type=click.Choice(policy_names() + gpu_policy_names(device_policies=False)), default=None,
              help="Decide with this policy (default: COSCHED_POLICY when --live, else its default).")
@gpu_policy_option("COSCHED_GPU_POLICY when --live, else its default")
def explain(job_id: str, queue: Path, machines: Path, live: bool, policy: str | None,
            gpu_policy_name: str | None) -> None:
    """Say why JOB (cluster.proc, or schedd#cluster.proc) is pinned where it is, or why it waits.

    It decides the cycle the sidecar would run now and prints what that cycle does with the
    job and, for each slot of its kind, whether the slot could take it and why not (slot
    draining/Owner/offline, Requirements or START refuse, too small, no room now). Users
    see the sidecar's last word with `condor_q -af CoSchedPinReason`. Exit 1 for an unknown job.

    \b
    Example:
      condor-sched explain 12.3 --live
    """
    from condor_sched.cycle import CycleConfig, CycleMemory, decide_cycle
    from condor_sched.explain import UnknownJob, explain as explain_job, find_job

    if live:
        from condor_sched import pool
        from condor_sched.settings import settings_from_htcondor

        try:
            settings = settings_from_htcondor()
            state = pool.read_state()
        except SettingsError as e:
            raise UsageFailure(str(e)) from None
        except pool.PoolUnreachable as e:
            raise click.ClickException(str(e)) from None
        config = CycleConfig.from_settings(settings, _profiles(settings.profile_dir))
        click.echo(_lease_line(settings.interval_s))
    else:
        state = _load_snapshot(queue, machines)
        config = CycleConfig.from_settings(SIDECAR_DEFAULTS, _profiles(None))
    if policy:
        config = config.with_policy(policy)
    if gpu_policy_name:
        config = config.with_gpu_policy(gpu_policy_name)
    try:
        job = find_job(state, job_id)
    except UnknownJob as e:
        raise click.ClickException(str(e)) from None
    decision = decide_cycle(state, CycleMemory.fresh(state), config)
    click.echo("\n".join(explain_job(state, decision, job)))


def _lease_line(interval_s: float) -> str:
    """Whether a sidecar holds the pool's lease and how fresh its last cycle is (``explain --live``)."""
    import time

    from condor_sched import lease, pool
    from condor_sched.daemon import AD_TYPE

    try:
        ads = [dict(ad) for ad in pool.generic_ads(AD_TYPE)]
    except Exception as e:  # noqa: BLE001 - the collector's answer only informs here
        return f"sidecar: cannot ask the collector for its ad ({type(e).__name__}: {e})"
    return lease.lease_status(ads, time.time(), interval_s)


def _profiles(directory: str | Path | None):
    """The profile store of ``directory`` (default: the shipped examples/profiles); bad files are logged."""
    from condor_sched.profiles import ProfileError, ProfileStore, default_profiles_dir

    try:
        store = ProfileStore.load_dir(directory or default_profiles_dir())
    except ProfileError as e:
        raise UsageFailure(str(e)) from None
    for skipped in getattr(store, "skipped", ()):
        logging.getLogger("condor_sched").warning("profile skipped: %s", skipped)
    return store


@main.command()
@click.argument("outdir", type=click.Path(path_type=Path))
def snapshot(outdir: Path) -> None:
    """Write queue.json and machines.json of the live pool (condor_q/condor_status -json format).

    Example: CONDOR_CONFIG=/path/to/condor_config condor-sched snapshot snap/
    """
    from condor_sched.pool import PoolUnreachable
    from condor_sched.snapshot import write_snapshot

    try:
        queue, machines = write_snapshot(outdir)
    except PoolUnreachable as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"wrote {queue} and {machines}")


class LeaseRefused(click.ClickException):
    """Another sidecar holds the pool's lease (exit 3)."""

    exit_code = 3


@main.command()
@click.option("--once", is_flag=True, help="Run one cycle and exit.")
@click.option("--dry-run", is_flag=True, help="Log what a cycle would do; edit nothing (may run beside the sidecar).")
@click.option("--policy", type=click.Choice(policy_names() + gpu_policy_names(device_policies=False)), default=None,
              help="Override COSCHED_POLICY (or COSCHED_SPREAD_POLICY, for a spread policy).")
@gpu_policy_option("COSCHED_GPU_POLICY")
def run(once: bool, dry_run: bool, policy: str | None, gpu_policy_name: str | None) -> None:
    """Run the sidecar: once per negotiation cycle, plan idle co-scheduled jobs and pin them.

    Settings are HTCondor knobs COSCHED_* (config.d/50-cosched-sidecar.conf). Without --once
    it is a daemon for a condor_master: it advertises a CoSchedSidecar ad after each cycle,
    re-reads its knobs on SIGHUP (condor_reconfig) and stops on SIGTERM (condor_off) within
    about a second. One sidecar edits a pool at a time: while another one's ad is live in the
    collector, run (also --once) refuses with exit 3, naming it; --dry-run edits nothing and
    may run beside it. A schedd that does not answer is left out of the cycle (warned once).
    Example: condor-sched run --once --dry-run
    """
    from condor_sched import daemon, lease, pool
    from condor_sched.cycle import CycleConfig
    from condor_sched.settings import settings_from_htcondor
    from condor_sched.sidecar import Sidecar
    from condor_sched.watch import Notices, ScheddWatch, WatchedRead

    sidecars: list[Sidecar] = []
    # Once-only warnings outlive a reconfig, as the cycle memory does.
    notices = Notices(logging.getLogger("condor_sched.sidecar"))
    read = WatchedRead(ScheddWatch(notices))
    sidecar_daemon: daemon.SidecarDaemon | None = None
    # The negotiator's last cycle end as the daemon's wait last read it (what started this
    # cycle): the sidecar ages pins by it without asking the collector again.
    end_read: list[int | None] = [None]

    def read_cycle_end() -> int | None:
        end_read[0] = pool.last_negotiation_cycle_end()
        return end_read[0]

    def configure() -> daemon.DaemonCycle:
        settings = settings_from_htcondor()
        config = CycleConfig.from_settings(settings, _profiles(settings.profile_dir))
        if policy:
            config = config.with_policy(policy)
        if gpu_policy_name:
            config = config.with_gpu_policy(gpu_policy_name)
        follows = settings.cycle_source == "negotiator"
        # --once has no earlier cycles to age pins by negotiation: each run counts, as in ``plan``
        sidecar = Sidecar(settings, config, read, None if dry_run else pool.JobEditor(), notices=notices,
                          should_stop=lambda: sidecar_daemon is not None and sidecar_daemon.stop_requested,
                          cycle_end=(lambda: end_read[0]) if follows and not once else None)
        if sidecars:  # a reconfig keeps the cycle count, when each job was first seen and pins' ages
            sidecar.memory, sidecar.last_negotiation_end = sidecars[-1].memory, sidecars[-1].last_negotiation_end
        sidecars[:] = [sidecar]
        spread = config.spread_policy.name if config.spread_policy else "none"
        return daemon.DaemonCycle(
            run_cycle=lambda: sidecar.run_cycle().numbers(), interval_s=settings.interval_s,
            cycle_end=read_cycle_end if follows else None,
            describe={"Policy": config.device_policy.name, "SpreadPolicy": spread,
                      "NodePolicy": config.node_policy.name if config.node_policy else "none",
                      "GpuPolicy": config.gpu_policy.name if config.gpu_policy else "none",
                      "CycleSource": settings.cycle_source, "DryRun": dry_run})

    try:
        if once:
            daemon.log_to_cosched_log()
            if not dry_run:
                daemon.refuse_if_a_sidecar_runs()
            configure().run_cycle()
            return
        sidecar_daemon = daemon.SidecarDaemon(configure, dry_run=dry_run)
        sidecar_daemon.install_signal_handlers()
        sidecar_daemon.serve()
    except (SettingsError, PolicyError) as e:
        raise UsageFailure(str(e)) from None
    except lease.LeaseHeld as e:
        raise LeaseRefused(str(e)) from None
    except pool.PoolUnreachable as e:
        raise click.ClickException(str(e)) from None


UNINSTALL_STEPS = """\
To switch condor_sched off for good, in this order:
  1. sidecar host: condor_off -daemon COSCHED_SIDECAR; remove 50-cosched-sidecar.conf and
     51-cosched-sidecar-site.conf from its config.d; condor_reconfig.
  2. every schedd host: remove 10-cosched-schedd.conf and 11-cosched-queue-super-user.conf;
     condor_reconfig (new jobs keep their Requirements); then run `condor-sched release`
     once more for jobs submitted in between.
  3. every execute node: remove 20-cosched-startd.conf, 30-cosched-execute.conf and
     31-cosched-slots.conf; condor_restart (the node gets its own slot layout back).
  4. central manager: remove 49-cosched-central-manager.conf; condor_reconfig.
(docs/admin.md, "Turning it off")"""


@main.command()
@click.option("--force", is_flag=True, help="Release even while a sidecar's ad says it runs (it re-enrolls jobs).")
def release(force: bool) -> None:
    """Release every co-scheduled job from condor_sched: the off switch.

    For each job with a saved CoSchedPinOriginalRequirements (on every schedd): unpin it,
    restore the Requirements it was submitted with and clear CoSchedPinReason. Idle malleable
    jobs lose their guest pins and reasons (running guests and mates run on as they are). Stop the
    sidecar first (a running one enrolls the jobs again); the command refuses while one
    advertises itself, unless --force. Prints the uninstall steps.

    \b
    Example:
      condor_off -daemon COSCHED_SIDECAR && condor-sched release
    """
    from condor_sched import pool

    try:
        running = pool.running_sidecars()
        if running and not force:
            raise click.ClickException(f"a sidecar still runs ({', '.join(running)}): stop it first "
                                       "(condor_off -daemon COSCHED_SIDECAR), or pass --force")
        jobs = pool.enrolled_jobs()
        guests = pool.idle_guests()
    except pool.PoolUnreachable as e:
        raise click.ClickException(str(e)) from None
    try:
        editor = pool.JobEditor()
        applied = editor.release(jobs)
        applied_guests = editor.release_guests(guests)
    except pool.PoolUnreachable as e:
        raise click.ClickException(str(e)) from None
    failed = [f"{key}: {why}" for key, why in sorted({**applied.failed, **applied_guests.failed}.items())]
    click.echo(f"released {len(jobs) - len(applied.failed)} of {len(jobs)} co-scheduled jobs")
    if guests:
        click.echo(f"unpinned {len(guests) - len(applied_guests.failed)} of {len(guests)} idle malleable jobs")
    for line in failed:
        click.echo(f"could not release {line}", err=True)
    click.echo(UNINSTALL_STEPS)
    if failed:
        sys.exit(1)


@main.command("install-node")
@click.argument("directory", type=click.Path(path_type=Path), required=False)
@click.option("--force", is_flag=True, help="Replace files that differ from the shipped node hooks.")
def install_node(directory: Path | None, force: bool) -> None:
    """Copy the execute-node programs (node_hooks/) into DIRECTORY, executable.

    DIRECTORY defaults to this install's PREFIX/libexec/condor_sched, the COSCHED_NODE_HOOKS
    that `condor-sched config` writes; copy it to the same path on every execute node
    (docs/admin.md). Each file is printed with what was done; files that differ from the
    shipped ones are refused (exit 1, nothing written) unless --force.

    \b
    Example:
      sudo condor-sched install-node
    """
    from condor_sched.install import InstallConflict, InstallPaths, install_node_hooks

    try:
        installed = install_node_hooks(directory or InstallPaths.running().node_hooks, force=force)
    except (InstallConflict, OSError) as e:
        raise click.ClickException(str(e)) from None
    for item in installed:
        click.echo(f"{item.action:9} {item.path}")


@main.command("config")
@click.argument("name", required=False)
@click.option("--list", "list_names", is_flag=True, help="Print the snippets' names only.")
@click.option("--prefix", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Install prefix the snippets name (PREFIX/bin/condor-sched, PREFIX/libexec/condor_sched); "
                   "default: this install's.")
@click.option("--node-hooks", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory of the node programs on the execute nodes (default: PREFIX/libexec/condor_sched).")
def config_command(name: str | None, list_names: bool, prefix: Path | None, node_hooks: Path | None) -> None:
    """Print the HTCondor config snippets (config.d/) an admin drops in, all or NAME.

    Each snippet's first lines say which hosts it is for (schedd hosts, execute nodes, the
    sidecar's host). Paths are this install's (or --prefix's), so a snippet is copied as it is.
    --list names them. Exit 2 for a name the package does not ship.

    \b
    Example:
      condor-sched config 50-cosched-sidecar.conf > /etc/condor/config.d/50-cosched-sidecar.conf
    """
    from condor_sched.install import InstallPaths, UnknownSnippet, config_snippet, config_snippets

    if prefix is not None and not prefix.is_absolute() or node_hooks is not None and not node_hooks.is_absolute():
        raise UsageFailure("--prefix and --node-hooks must be absolute paths")
    paths = InstallPaths.under(prefix) if prefix else InstallPaths.running()
    if node_hooks:
        paths = InstallPaths(paths.sidecar, node_hooks)
    if list_names:
        click.echo("\n".join(config_snippets()))
    elif name:
        try:
            click.echo(config_snippet(name, paths), nl=False)
        except UnknownSnippet as e:
            raise UsageFailure(str(e)) from None
    else:
        for snippet in config_snippets():
            click.echo(f"# ===== {snippet} =====")
            click.echo(config_snippet(snippet, paths), nl=False)


@main.group()
def pool() -> None:
    """A real local HTCondor pool for trying condor_sched and for its tests (root only).

    Example: sudo condor-sched pool up && eval "$(condor-sched pool env)" && condor_q
    """


@pool.command("up")
@click.option("--inventory", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Node inventory YAML (default: examples/pools/default.yaml).")
@click.option("--workdir", type=click.Path(path_type=Path), default=None,
              help="Shared job directory, the same path inside and outside the pool.")
@click.option("--sidecar", is_flag=True,
              help="Also run the sidecar as a daemon of the pool's master (config.d/50-cosched-sidecar.conf).")
def pool_up(inventory: Path | None, workdir: Path | None, sidecar: bool) -> None:
    """Build (once, cached) and start the pool: one startd per inventory node.

    Example: sudo condor-sched pool up --sidecar
    """
    from condor_sched import localpool
    from condor_sched.inventory import InventoryError
    from condor_sched.resources import ResourceMissing

    try:
        info = localpool.up(inventory, workdir, sidecar=sidecar)
    except (localpool.PoolError, InventoryError, ResourceMissing) as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"pool up: {len(info.slot_names)} partitionable slots on {len(info.nodes)} nodes; "
               f"shared workdir {info.workdir}")
    for user, path in sorted(info.client_configs.items()):
        click.echo(f"  CONDOR_CONFIG={path}   # act as {user}")


@pool.command("down")
def pool_down() -> None:
    """Stop every pool process and unmount everything (also after a failed run)."""
    from condor_sched import localpool

    try:
        localpool.down()
    except localpool.PoolError as e:
        raise click.ClickException(str(e)) from None
    click.echo("pool down")


@pool.command("status")
def pool_status() -> None:
    """Print the pool's state as JSON (built, mounted, processes, daemons, slots)."""
    from condor_sched import localpool

    try:
        click.echo(json.dumps(localpool.status(), indent=2, sort_keys=True, default=str))
    except localpool.PoolError as e:
        raise click.ClickException(str(e)) from None


@pool.command("env")
@click.option("--user", default="alice", show_default=True, help="Identity: alice (submitter) or condor (admin).")
def pool_env(user: str) -> None:
    """Print the export line that points htcondor2 and condor_* tools at the pool."""
    from condor_sched import localpool

    for key, value in localpool.client_env(user).items():
        click.echo(f"export {key}={value}")


main.add_command(doctor)
main.add_command(interference)


def _add_optional_commands() -> None:
    try:
        from condor_sched.simulate.command import simulate
    except ImportError:  # the simulator is optional at import time
        return
    main.add_command(simulate)


_add_optional_commands()

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
