"""The ``condor-sched simulate`` command (the lead adds it to the CLI group)."""
from __future__ import annotations

import sys
from contextlib import nullcontext
from dataclasses import replace

import click

from condor_sched.inventory import MAX_NODES, InventoryError, load_inventory
from condor_sched.options import AGE_CYCLES, MAX_SEQUENCES, SEED, THREAD_OVERCOMMIT, BoundedFloat, bounded_int
from condor_sched.modes.planning import PlanSettings, PolicyError, PolicyKind
from condor_sched.modes.registry import policy_names
from condor_sched.profiles import ProfileError
from condor_sched.simulate.engine import DEFAULT_CYCLE_S, MAX_CYCLE_S, MIN_CYCLE_S, SimulationError
from condor_sched.simulate.metrics import PlotError, to_json, write_plots
from condor_sched.modes.mates.cpu_nodes import RuntimeModel
from condor_sched.modes.mates.sd import DEFAULT_MAX_SLOWDOWN, DEFAULT_MAX_SLOWDOWN_LABEL
from condor_sched.simulate.cpu_jobs import parse_max_slowdown, read_swf_nodes, simulate_node_policy
from condor_sched.simulate.offload import MODELS
from condor_sched.simulate.study import simulate_report, spec_for
from condor_sched.settings import SidecarSettings
from condor_sched.simulate.gpu_study import MAX_BATCH, PROTOCOLS, is_openb, simulate_openb
from condor_sched.simulate.hybrid003 import KEYS as HYBRID003_KEYS, POLICIES as HYBRID003_POLICIES, simulate_hybrid003
from condor_sched.simulate.hybrid003_model import DEADLINE_RULES, INTERFERENCE_READINGS, ModelSettings
from condor_sched.simulate.hybrid003_workload import SIZES as HYBRID003_SIZES
from condor_sched.simulate.openb import OpenbError
from condor_sched.simulate.overcommit004 import KEYS as OVERCOMMIT004_KEYS, MAX_MIX_NODES, WORKLOAD as OVERCOMMIT004
from condor_sched.simulate.workloads import MAX_WORKLOAD_JOBS, WorkloadError, default_jobs, is_builtin

#: Exit codes scripts can rely on.
EXIT_BAD_INPUT = 2
EXIT_SIMULATION = 3

class BadInput(click.ClickException):
    exit_code = EXIT_BAD_INPUT


_KEYS = ("makespan_s", "mean_wait_s", "mean_turnaround_s", "mean_slowdown", "throughput",
         "device_utilization", "memory_oversubscriptions", "thread_oversubscribed_s", "footprint_nodes",
         "mean_run_s", "mean_run_ratio", "alpha_violations", "alpha_violations_total", "core_utilization",
         "bw_oversubscribed_s", "mean_scale")


@click.command("simulate")
@click.option("--workload", "workload", default="phi-table1", show_default=True,
              help="phi-table1, phi-uniform, phi-normal, phi-low-skew, phi-high-skew, phi-diverse (device jobs "
                   "of nine thread sizes from 4 to 240 and 200-3400 MB), sns-random "
                   "(paper 000: parallel CPU jobs, profile model, Xeon nodes; policies ce, cs, sns, "
                   "sns-global), hybrid-003 (paper 003: HPC and data-intensive jobs on 4, 8 or 16 nodes of "
                   "32 cores; policies vanilla, collocated, hybrid, koordinator, autopilot), overcommit-004 "
                   "(paper 004: batch and interactive jobs on nodes of 2 vCPUs, the measured pair slowdowns; "
                   "policies exclusive, naive, overcommit, and overcommit-measured: the model replaced by the measured "
                   "labels, a yardstick), or a .swf/.yaml path.")
@click.option("--jobs", type=bounded_int(1, MAX_WORKLOAD_JOBS), default=None,
              help="Jobs to generate (built-in workloads, default 1000; sns-random 20) or to read (files, default all).")
@click.option("--nodes", type=bounded_int(1, MAX_NODES), default=None,
              help="Nodes: K one-Phi (sns-random: dual-Xeon) nodes (default 8), or the first K nodes of "
                   "--inventory (default all).")
@click.option("--policy", default=None,
              help="A registered policy name (default: the sidecar's own default for the workload's jobs: "
                   "COSCHED_POLICY's for device workloads, COSCHED_SPREAD_POLICY's for sns-random, "
                   "COSCHED_NODE_POLICY's with --cores-per-node, COSCHED_GPU_POLICY's for openb), so the "
                   "figures are what an admin gets.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seeds the workload and the policy.")
@click.option("--inventory", "inventory_path", type=click.Path(dir_okay=False), default=None,
              help="Node inventory YAML (as the local pool's); default: paper 002's one-Phi nodes.")
@click.option("--sequences", type=bounded_int(1, MAX_SEQUENCES), default=None,
              help="Run M independently seeded sequences and report their means.")
@click.option("--footprint-against", "footprint_against", default=None, metavar="P0",
              help="Also report the fewest nodes at which --policy matches P0's makespan on --nodes.")
@click.option("--cycle-s", "cycle_s", type=BoundedFloat(MIN_CYCLE_S, MAX_CYCLE_S), default=None,
              help=f"Negotiation interval (HTCondor's NEGOTIATOR_INTERVAL; default {DEFAULT_CYCLE_S:g}).")
@click.option("--protocol", type=click.Choice(PROTOCOLS), default=None,
              help="openb workloads: the FGD paper's inflation protocol (default) or a replay of the "
                   "trace's arrivals and durations.")
@click.option("--batch", type=bounded_int(1, MAX_BATCH), default=None,
              help="openb inflation protocol: tasks planned per negotiation cycle (default 1, the "
                   "paper's online arrival).")
@click.option("--age-limit-cycles", "age_limit_cycles", type=AGE_CYCLES, default=None,
              help="The policies' aging limit (PlanSettings.age_limit_cycles; default: the sidecar's); "
                   "also the spread policies' unless --spread-age-limit-cycles is given. "
                   "scripts/reproduce turns aging off, as paper 002 has none.")
@click.option("--spread-age-limit-cycles", "spread_age_limit_cycles", type=AGE_CYCLES, default=None,
              help="The spread policies' aging limit (PlanSettings.spread_age_limit_cycles; default: "
                   "--age-limit-cycles if given, else the sidecar's 30).")
@click.option("--thread-overcommit", "thread_overcommit", type=THREAD_OVERCOMMIT, default=1.0,
              show_default=True, help="Device threads a plan may use, as a multiple of the hardware threads "
                                      "(the offload model serialises what oversubscribes them, as COSMIC does).")
@click.option("--offload-model", "offload_model", type=click.Choice(sorted(MODELS)), default="offload",
              show_default=True, help="Device workloads: offloads of equal length (offload), or lengths drawn "
                                      "per offload with the same totals (offload-drawn).")
@click.option("--cores-per-node", "cores_per_node", type=bounded_int(1, 4096), default=None,
              help="Read the .swf workload as rigid CPU jobs on whole nodes of C cores (paper 001) and "
                   "simulate a node policy: backfill, sd (EASY, planning at every submit and finish) or "
                   "slurm-backfill, slurm-sd (SLURM 17.11's sched/backfill at its defaults: the main "
                   "scheduler at every submit and finish, a backfill pass every 30 s); --cycle-s plays "
                   "no part; --nodes counts these CPU nodes.")
@click.option("--max-slowdown", "max_slowdown", default=None, metavar="X|unbounded|dynamic",
              help=f"sd, slurm-sd: MAX_SLOWDOWN, the cut-off of a mate's penalty (default "
                   f"{DEFAULT_MAX_SLOWDOWN_LABEL}, ours).")
@click.option("--runtime-model", "runtime_model", type=click.Choice([m.value for m in RuntimeModel]),
              default="ideal", show_default=True,
              help="With --cores-per-node: what really happens to a job whose nodes hold unequal cores "
                   "(paper 001, Eq. 5 ideal, Eq. 6 worst case).")
@click.option("--interference", type=click.Choice(INTERFERENCE_READINGS), default=None,
              help="hybrid-003: what the idle class removes of Table I's collocated slowdown: nothing "
                   "(shared, the default: caches, bandwidth, network) or all of it (time-slicing).")
@click.option("--parallel-idle", "parallel_idle", type=BoundedFloat(0.0, 1.0), default=None,
              help="hybrid-003: the parallel stages' idle share as a multiple of the stand-in's (default 1; "
                   "0: every parallel stage uses all its cores).")
@click.option("--deadlines", type=click.Choice(DEADLINE_RULES), default=None,
              help="hybrid-003: a job past its requested time is killed (kill, the default, Section IV) or "
                   "runs on and counts as missed (overrun).")
@click.option("--interference-guard", "interference_guard", is_flag=True,
              help="Device and sns workloads: run each seed twice, with COSCHED_INTERFERENCE off and on (paper "
                   "004's model on the shipped dataset; each simulated program runs a measured kernel), and "
                   "report both makespans, the loss and the measured ill-matched share of co-running time "
                   "(default --cycle-s 5).")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False), default=None,
              help="Write utilisation and concurrency PNGs to this directory (needs matplotlib).")
def simulate_command(workload: str, jobs: int | None, nodes: int | None, policy: str, seed: int,
                     inventory_path: str | None, sequences: int | None, footprint_against: str | None,
                     cycle_s: float, age_limit_cycles: int | None, spread_age_limit_cycles: int | None,
                     thread_overcommit: float, offload_model: str, cores_per_node: int | None,
                     max_slowdown: str | None, runtime_model: str, as_json: bool, plot_dir: str | None,
                     protocol: str | None, batch: int | None, interference: str | None,
                     parallel_idle: float | None, deadlines: str | None, interference_guard: bool = False) -> None:
    """Simulate a workload under a policy on a simulated pool.

    \b
    Example (Table II's MCCK on 8 nodes, 5 s cycles, footprint against MC):
      condor-sched simulate --workload phi-table1 --jobs 1000 --nodes 8 \\
          --policy knapsack --seed 1 --cycle-s 5 --footprint-against exclusive --json
    Example (paper 000's Section 6.2: 10 random 20-job sequences under SNS):
      condor-sched simulate --workload sns-random --sequences 10 --policy sns \\
          --cycle-s 5 --age-limit-cycles 120 --json
    Example (paper 001's SD-Policy on the RICC trace, 1024 nodes of 8 cores):
      condor-sched simulate --workload RICC-2010-2-midseptember.swf --cores-per-node 8 \\
          --nodes 1024 --policy sd --max-slowdown dynamic --runtime-model worst --json
    Example (the same on the paper's baseline, SLURM's backfill at its defaults):
      condor-sched simulate --workload RICC-2010-2-midseptember.swf --cores-per-node 8 \\
          --nodes 1024 --policy slurm-sd --max-slowdown unbounded --json
    Example (paper 003's Table II: spare capacity on 16 nodes of 32 cores):
      condor-sched simulate --workload hybrid-003 --nodes 16 --policy hybrid --seed 1 --json
    Example (paper 004's overcommitting, the measured pairs, 8 nodes of 2 vCPUs):
      condor-sched simulate --workload overcommit-004 --nodes 8 --policy overcommit --seed 1 --json
    Example (the FGD paper's protocol on Alibaba's openb GPU trace, 10 seeds, 128-task cycles):
      condor-sched simulate --workload openb:openb_pod_list_default.csv \\
          --inventory openb:openb_node_list_gpu_node.csv --protocol inflation --policy fgd \\
          --seed 0 --sequences 10 --batch 128 --json
    """
    model_options = (("--interference", interference), ("--parallel-idle", parallel_idle), ("--deadlines", deadlines))
    if workload != HYBRID003 and any(given is not None for _, given in model_options):
        raise BadInput(f"{', '.join(name for name, given in model_options if given is not None)}: only for "
                       f"--workload {HYBRID003}")
    if workload == OVERCOMMIT004:
        refused = [name for name, given in (("--jobs", jobs), ("--inventory", inventory_path), ("--sequences", sequences),
                                            ("--footprint-against", footprint_against), ("--cores-per-node", cores_per_node),
                                            ("--max-slowdown", max_slowdown), ("--plot", plot_dir), ("--protocol", protocol),
                                            ("--batch", batch), ("--cycle-s", cycle_s)) if given is not None]
        _simulate_overcommit004(nodes, policy, seed, refused, as_json)
        return
    if workload == HYBRID003:
        refused = [name for name, given in (("--jobs", jobs), ("--inventory", inventory_path), ("--sequences", sequences),
                                            ("--footprint-against", footprint_against), ("--cores-per-node", cores_per_node),
                                            ("--max-slowdown", max_slowdown), ("--plot", plot_dir), ("--protocol", protocol),
                                            ("--batch", batch), ("--cycle-s", cycle_s)) if given is not None]
        model = ModelSettings(interference or "shared", 1.0 if parallel_idle is None else parallel_idle,
                              deadlines or "kill")
        _simulate_hybrid003(nodes, policy, seed, model, refused, as_json)
        return
    if is_openb(workload) or is_openb(inventory_path):
        refused = [name for name, given in (("--jobs", jobs), ("--nodes", nodes), ("--cores-per-node", cores_per_node),
                                            ("--footprint-against", footprint_against), ("--plot", plot_dir),
                                            ("--max-slowdown", max_slowdown)) if given is not None]
        _simulate_openb(workload, inventory_path, protocol or "inflation", policy, seed, batch, sequences, cycle_s,
                        refused, as_json)
        return
    if protocol is not None or batch is not None:
        raise BadInput("--protocol and --batch belong to openb workloads (--workload openb:PODS.csv "
                       "--inventory openb:NODES.csv)")
    policy = policy or sidecar_default_policy(workload, cores_per_node)
    if interference_guard:
        refused = [name for name, given in (("--inventory", inventory_path), ("--footprint-against", footprint_against),
                                            ("--cores-per-node", cores_per_node), ("--max-slowdown", max_slowdown),
                                            ("--plot", plot_dir)) if given is not None]
        _simulate_guard_cost(workload, jobs, nodes or 8, policy, seed, sequences, cycle_s,
                             _plan_settings(thread_overcommit, age_limit_cycles, spread_age_limit_cycles), refused,
                             as_json)
        return
    cycle_s = DEFAULT_CYCLE_S if cycle_s is None else cycle_s
    if cores_per_node is not None or max_slowdown is not None or policy in policy_names(PolicyKind.NODE):
        _simulate_node_jobs(workload, jobs, nodes, policy, cores_per_node, max_slowdown, runtime_model, as_json)
        return
    try:
        inventory = None
        if inventory_path:
            inventory = load_inventory(inventory_path)
        elif not is_builtin(workload) and nodes is None:
            nodes = 8
        if plot_dir is not None:
            import importlib.util

            if importlib.util.find_spec("matplotlib") is None:
                raise PlotError("--plot needs matplotlib: pip install 'condor-sched[plot]'")
        settings = _plan_settings(thread_overcommit, age_limit_cycles, spread_age_limit_cycles)
        _check_policy_kind(policy)
        spec = spec_for(workload, policy, cycle_s, settings, inventory, nodes or 8, offload_model)
        show_bar = sys.stdout.isatty() and not as_json
        total = (sequences or 1) * (jobs or default_jobs(workload)) if is_builtin(workload) else None
        bar = click.progressbar(length=total, label="simulating") if show_bar and total else nullcontext()
        with bar as b:
            report, results = simulate_report(
                workload, jobs, spec, nodes, seed, sequences, footprint_against, record=plot_dir is not None,
                progress=(b.update if b is not None else None))
    except (InventoryError, WorkloadError, PolicyError, PlotError, ProfileError, ValueError) as e:
        raise BadInput(str(e)) from None
    except SimulationError as e:
        click.echo(f"Error: {e}", err=True)
        sys.exit(EXIT_SIMULATION)
    if plot_dir is not None:
        paths = write_plots([(f"{policy} seed {r.get('seed', seed)}", res)
                             for r, res in zip(report.get("sequences", [report]), results)], plot_dir)
        if not as_json:
            for p in paths:
                click.echo(f"wrote {p}")
    if as_json:
        click.echo(to_json(report))
        return
    click.echo(f"{report['workload']}: {report['jobs']} jobs, {report['nodes']} nodes, policy {policy}, "
               f"cycle {cycle_s:g} s")
    if report.get("skipped_jobs"):
        click.echo(f"  skipped {report['skipped_jobs']} trace jobs (no run time, processors or submit time)")
    for key in _KEYS:
        if key in report:
            value = report[key]
            click.echo(f"  {key:26} {value:.3f}" if isinstance(value, float) else f"  {key:26} {value}")


def _check_policy_kind(policy: str) -> None:
    """Device and sns workloads run device and spread planners: a planner of spare-capacity or
    overcommitted jobs has its own workload (hybrid-003, overcommit-004), or none."""
    from condor_sched.modes.registry import get_policy

    kind = getattr(get_policy(policy), "kind", PolicyKind.DEVICE)
    if kind not in (PolicyKind.DEVICE, PolicyKind.SPREAD):
        raise ValueError(f"--policy {policy} places {kind.value} jobs; device workloads take "
                         f"{', '.join(policy_names(PolicyKind.DEVICE))} and sns-random takes "
                         f"{', '.join(policy_names(PolicyKind.SPREAD))}")


def _plan_settings(thread_overcommit: float, age_limit_cycles: int | None,
                   spread_age_limit_cycles: int | None) -> PlanSettings:
    settings = PlanSettings(thread_overcommit=thread_overcommit)
    if age_limit_cycles is not None:
        settings = replace(settings, age_limit_cycles=age_limit_cycles, spread_age_limit_cycles=age_limit_cycles)
    if spread_age_limit_cycles is not None:
        settings = replace(settings, spread_age_limit_cycles=spread_age_limit_cycles)
    return settings


def _simulate_guard_cost(workload: str, jobs: int | None, nodes: int, policy: str, seed: int, sequences: int | None,
                         cycle_s: float | None, settings: PlanSettings, refused: list[str], as_json: bool) -> None:
    """``simulate --interference-guard``: the guard's price in the device or spread mode (guard_cost.py)."""
    from condor_sched.interference.dataset import DatasetError
    from condor_sched.interference.report import default_dataset
    from condor_sched.simulate.guard_cost import GUARD_CYCLE_S, guard_cost_summary
    from condor_sched.simulate.study import sequence_seeds

    try:
        if refused:
            raise ValueError(f"{', '.join(refused)}: not with --interference-guard")
        if not is_builtin(workload):
            raise ValueError(f"--interference-guard runs the built-in device and sns workloads, not {workload!r}")
        seeds = [seed] if sequences is None else sequence_seeds(seed, sequences)
        report = guard_cost_summary(workload, policy, nodes, seeds, str(default_dataset()), jobs,
                                   GUARD_CYCLE_S if cycle_s is None else cycle_s, settings)
    except (WorkloadError, PolicyError, DatasetError, ValueError) as e:
        raise BadInput(str(e)) from None
    except SimulationError as e:
        click.echo(f"Error: {e}", err=True)
        sys.exit(EXIT_SIMULATION)
    _echo_report(report, GUARD_KEYS, as_json, f"{workload} on {nodes} nodes, policy {policy}, cycle "
                 f"{report['cycle_s']:g} s, COSCHED_INTERFERENCE off / on, {len(seeds)} seed(s)")


GUARD_KEYS = ("makespan_off_s", "makespan_on_s", "makespan_loss", "max_makespan_loss", "ill_matched_share_off",
              "ill_matched_share_on", "jobs_made_to_wait_on", "oracle_makespan_loss", "ill_matched_share_oracle")


def sidecar_default_policy(workload: str, cores_per_node: int | None) -> str:
    """The policy the sidecar runs by default for this workload's jobs: its node policy for whole-
    node CPU jobs (--cores-per-node), its spread policy for Spread-n-Share jobs, else its device policy."""
    defaults = SidecarSettings()
    if cores_per_node is not None:
        return defaults.node_policy
    return defaults.spread_policy if workload.startswith("sns") else defaults.policy


def _simulate_openb(workload: str, inventory: str | None, protocol: str, policy: str | None, seed: int,
                    batch: int | None, sequences: int | None, cycle_s: float | None, refused: list[str],
                    as_json: bool) -> None:
    """``simulate`` on the openb GPU trace (simulate/gpu_study.py)."""
    try:
        if refused:
            raise ValueError(f"{', '.join(refused)}: not for an openb run (the trace gives the tasks and the nodes)")
        if protocol == "inflation" and cycle_s is not None:
            raise ValueError("--cycle-s belongs to --protocol replay; the inflation protocol takes --batch")
        if protocol == "replay" and batch is not None:
            raise ValueError("--batch belongs to --protocol inflation; the replay takes --cycle-s")
        policy = policy or SidecarSettings().gpu_policy
        report = simulate_openb(workload, inventory, protocol, policy, seed, batch or 1, sequences,
                                DEFAULT_CYCLE_S if cycle_s is None else cycle_s)
    except (OpenbError, PolicyError, ValueError) as e:
        raise BadInput(str(e)) from None
    if as_json:
        click.echo(to_json(report))
        return
    click.echo(f"{report['workload']} on {report['inventory']}: {report['tasks']} tasks, {report['nodes']} nodes, "
               f"{report['gpus']} GPUs, policy {policy}, protocol {protocol}")
    for key, value in report.items():
        if isinstance(value, (int, float)) and key not in ("tasks", "nodes", "gpus"):
            click.echo(f"  {key:28} {value:.3f}" if isinstance(value, float) else f"  {key:28} {value}")


HYBRID003 = "hybrid-003"


def _simulate_hybrid003(nodes: int | None, policy: str | None, seed: int, model: ModelSettings, refused: list[str],
                        as_json: bool) -> None:
    """``simulate --workload hybrid-003``: paper 003's cluster experiments (simulate/hybrid003.py)."""
    nodes = 16 if nodes is None else nodes
    policy = policy or "hybrid"
    _check_fixed_workload(HYBRID003, refused, policy, HYBRID003_POLICIES)
    if nodes not in HYBRID003_SIZES:
        raise BadInput(f"--workload {HYBRID003} runs on {', '.join(map(str, HYBRID003_SIZES))} nodes "
                       f"(paper 003, Section IV-A), not {nodes}")
    report = simulate_hybrid003(nodes, policy, seed, model)
    _echo_report(report, HYBRID003_KEYS, as_json,
                 f"{HYBRID003}: {nodes} nodes x 32 cores, policy {policy}, seed {seed}, model {model.label()}")


def _check_fixed_workload(workload: str, refused: list[str], policy: str, policies: tuple[str, ...]) -> None:
    """A built-in experiment takes --nodes, --policy and --seed only, and one of its policies."""
    if refused:
        raise BadInput(f"{', '.join(refused)}: not for --workload {workload} (it takes --nodes, --policy, --seed)")
    if policy not in policies:
        raise BadInput(f"--workload {workload} takes --policy {'|'.join(policies)}, not {policy!r}")


def _echo_report(report: dict, keys: tuple[str, ...], as_json: bool, title: str) -> None:
    if as_json:
        click.echo(to_json(report))
        return
    click.echo(title)
    for key in keys:
        click.echo(f"  {key:26} {report[key]:.3f}")


def _simulate_overcommit004(nodes: int | None, policy: str | None, seed: int, refused: list[str], as_json: bool) -> None:
    """``simulate --workload overcommit-004``: paper 004's overcommitting (simulate/overcommit004.py)."""
    from condor_sched.simulate.overcommit004 import SIMULATED_POLICIES, simulate_overcommit004

    nodes = 8 if nodes is None else nodes
    policy = policy or "overcommit"
    if nodes > MAX_MIX_NODES:
        raise BadInput(f"--workload {OVERCOMMIT004} runs on at most {MAX_MIX_NODES} nodes, not {nodes}")
    _check_fixed_workload(OVERCOMMIT004, refused, policy, SIMULATED_POLICIES)
    report = simulate_overcommit004(nodes, policy, seed)
    _echo_report(report, OVERCOMMIT004_KEYS, as_json, f"{OVERCOMMIT004}: {nodes} nodes x 2 vCPUs, policy {policy}, seed {seed}")


def _simulate_node_jobs(workload: str, jobs: int | None, nodes: int | None, policy: str, cores_per_node: int | None,
                        max_slowdown: str | None, runtime_model: str, as_json: bool) -> None:
    """``simulate --cores-per-node``: paper 001's whole-node CPU jobs (simulate/cpu_jobs.py)."""
    try:
        if cores_per_node is None:
            raise ValueError(f"--policy {policy} and --max-slowdown need --cores-per-node (whole-node CPU jobs)")
        if not workload.endswith(".swf"):
            raise ValueError(f"--cores-per-node reads an .swf log, not {workload!r}")
        if nodes is None:
            raise ValueError("--cores-per-node needs --nodes (the CPU nodes of the pool)")
        limit = parse_max_slowdown(max_slowdown) if max_slowdown is not None else DEFAULT_MAX_SLOWDOWN
        settings = PlanSettings(sd_max_slowdown=limit)
        report = simulate_node_policy(read_swf_nodes(workload, cores_per_node, jobs), nodes, cores_per_node, policy,
                                      settings, RuntimeModel(runtime_model))
    except (WorkloadError, PolicyError, ValueError) as e:
        raise BadInput(str(e)) from None
    if as_json:
        click.echo(to_json(report))
        return
    click.echo(f"{report['workload']}: {report['jobs']} jobs, {nodes} nodes x {cores_per_node} cores, "
               f"policy {policy}, {runtime_model} runtime model")
    for key in _NODE_KEYS:
        value = report[key]
        click.echo(f"  {key:26} {value:.3f}" if isinstance(value, float) else f"  {key:26} {value}")


_NODE_KEYS = ("makespan_s", "mean_turnaround_s", "mean_wait_s", "mean_slowdown", "malleable_jobs", "mate_jobs",
              "malleable_fraction")


#: The name the CLI group imports (``condor_sched.cli``).
simulate = simulate_command
