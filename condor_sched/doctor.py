"""``condor-sched doctor``: what each role of a host needs, checked, every problem with its fix.

A host's roles come from its DAEMON_LIST: ``schedd`` (SCHEDD), ``execute`` (STARTD) and
``sidecar`` (COSCHED_SIDECAR); a host may have several. The pool checks (the sidecar's lease,
one condor_sched release on every host) run on every host. The checks themselves are pure
functions of a :class:`HostView` (:mod:`condor_sched.doctor_checks`); this module picks them
by role and renders the report.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Mapping

from condor_sched.daemon import DRY_RUN_PREFIX
from condor_sched.lease import heard_and_lease, within_lease
from condor_sched.doctor_checks import (NODE_ADS, SIDECAR_ADS, Finding, HostView, check_execute_knobs,
                                        check_node_agent, check_node_config, check_prepare_hook, check_schedd,
                                        check_sidecar_log, check_sidecar_program, failed, installed_node_version,
                                        is_cosched_node, passed, sidecar_account)

__all__ = ["ROLE_DAEMONS", "Finding", "HostView", "Report", "diagnose", "host_roles"]

#: Each role and the DAEMON_LIST entry that gives a host that role.
ROLE_DAEMONS = {"schedd": "SCHEDD", "execute": "STARTD", "sidecar": "COSCHED_SIDECAR"}
#: What the live collector is asked for NODE_ADS.
NODE_AD_CONSTRAINT = "CoSchedNodeConfigOK =!= undefined"
NODE_AD_PROJECTION = ["Machine", "Name", "CoSchedNodeVersion"]
UPGRADE_HINT = "one release on every host: `pip install` the same condor_sched wheel"


@dataclass(frozen=True, slots=True)
class Report:
    """doctor's findings for one host."""

    host: str
    roles: tuple[str, ...]
    findings: tuple[Finding, ...]

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if not f.ok]

    @property
    def ok(self) -> bool:
        return not self.problems

    def text(self) -> str:
        """``ok   <what>`` per check passed, ``FAIL <what>: <why>`` and its ``fix:`` per problem, a summary."""
        lines = []
        for finding in self.findings:
            if finding.ok:
                lines.append(f"ok   {finding.what}" + (f": {finding.why}" if finding.why else ""))
            else:
                lines += [f"FAIL {finding.what}: {finding.why}", f"     fix: {finding.fix}"]
        roles = ", ".join(self.roles) or "no condor_sched role"
        passed_count = len(self.findings) - len(self.problems)
        lines.append(f"doctor: {self.host} ({roles}): {passed_count} ok, {len(self.problems)} "
                     f"problem{'' if len(self.problems) == 1 else 's'}")
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {"host": self.host, "roles": list(self.roles), "ok": self.ok,
                "passed": len(self.findings) - len(self.problems), "problems": len(self.problems),
                "findings": [asdict(f) for f in self.findings]}


def host_roles(view: HostView) -> list[str]:
    """The roles DAEMON_LIST gives this host, in :data:`ROLE_DAEMONS` order (the startd of a local
    name is an execute role)."""
    return [role for role, daemon in ROLE_DAEMONS.items() if view.has_word("DAEMON_LIST", daemon)
            or (role == "execute" and view.local_name and view.has_word("DAEMON_LIST", view.local_name))]


def check_sidecar_host(view: HostView) -> list[Finding]:
    account, findings = sidecar_account(view)
    if account is None:
        return findings
    return findings + check_sidecar_program(view, account) + check_sidecar_log(view, account)


def check_execute_node(view: HostView) -> list[Finding]:
    """A condor_sched node's knobs, node config, hook and agent; any other startd is fine as it is."""
    if not is_cosched_node(view):
        return [passed("execute node", f"not a condor_sched node (START names no CoSched policy, no node config at "
                       f"{view.node_config_path}): its slots run jobs as before")]
    findings = check_execute_knobs(view)
    config, config_findings = check_node_config(view)
    findings += config_findings + check_prepare_hook(view)
    if config is not None:
        findings += check_node_agent(view, config)
    return findings


def _is_dry_run(ad: Mapping[str, Any]) -> bool:
    return ad.get("CoSchedDryRun") is True or str(ad.get("Name", "")).startswith(DRY_RUN_PREFIX)


def _heard(ad: Mapping[str, Any], now: float) -> tuple[float, int]:
    """(seconds since the collector heard from the ad's sidecar, its lease in seconds)."""
    return heard_and_lease(ad, now)


def _who(ad: Mapping[str, Any]) -> str:
    return f"{ad.get('Name', '?')} on {ad.get('Machine', '?')}"


def check_lease(view: HostView, ads: list[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], list[Finding]]:
    """The sidecar's lease, its ad: present and heard from within its ClassAdLifetime. Returns
    the live sidecars' ads too."""
    what = "sidecar lease (CoSchedSidecar ad)"
    fix = ("on the sidecar's host: condor_on -daemon COSCHED_SIDECAR, then read its COSCHED_LOG and MasterLog "
           "(`condor-sched doctor` there checks its program and log); advertising needs ALLOW_DAEMON at the "
           "collector for its identity")
    now = view.clock()
    sidecars = [ad for ad in ads if not _is_dry_run(ad)]
    if not sidecars:
        return [], [failed(what, "missing: the collector has no CoSchedSidecar ad, so no sidecar runs and "
                           "co-scheduled jobs wait unpinned", fix)]
    live = [ad for ad in sidecars if within_lease(ad, now)]
    if not live:
        newest = min(sidecars, key=lambda ad: _heard(ad, now)[0])
        age, lease_s = _heard(newest, now)
        return [], [failed(what, f"stale: {_who(newest)} was last heard from {age:.0f} s ago, beyond its "
                           f"ClassAdLifetime of {lease_s} s: it died or cannot reach the collector", fix)]
    age, lease_s = _heard(live[0], now)
    findings = [passed(what, f"{_who(live[0])}, heard from {age:.0f} s ago (lease {lease_s} s)")]
    if len(live) > 1:
        findings.append(failed("sidecar lease", f"{len(live)} sidecars hold live leases: "
                               + ", ".join(_who(ad) for ad in live),
                               "one sidecar at a time: condor_off -daemon COSCHED_SIDECAR on all hosts but one"))
    for ad in live:
        for attr, about in (("CoSchedConfigError", "its configuration"), ("CoSchedLastError", "its last cycle")):
            if ad.get(attr):
                findings.append(failed(f"sidecar {_who(ad)}: {about} ({attr})", str(ad[attr]),
                                       f"read COSCHED_LOG on {ad.get('Machine', 'its host')}; fix what it names "
                                       "(condor_reconfig re-reads the knobs)"))
    return live, findings


def _named(machines: Iterable[str], shown: int = 5) -> str:
    names = sorted(machines)
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def check_versions(view: HostView, sidecars: list[Mapping[str, Any]],
                   nodes: list[Mapping[str, Any]]) -> list[Finding]:
    """This install's release equals the sidecar's (CoSchedVersion), every node's
    (CoSchedNodeVersion) and that of this host's node programs."""
    mine, findings, agreeing = view.version, [], []
    for ad in sidecars:
        version = ad.get("CoSchedVersion")
        if version == mine:
            agreeing.append("the sidecar")
            continue
        findings.append(failed(f"version of the sidecar {_who(ad)}",
                               f"runs condor_sched {version or '(no CoSchedVersion: an older release)'}, this "
                               f"install is {mine}",
                               f"{UPGRADE_HINT} on {ad.get('Machine', 'its host')} and here, then condor_off -daemon "
                               "COSCHED_SIDECAR && condor_on -daemon COSCHED_SIDECAR there"))
    by_version: dict[Any, set[str]] = defaultdict(set)
    for ad in nodes:
        by_version[ad.get("CoSchedNodeVersion")].add(str(ad.get("Machine", ad.get("Name", "?"))))
    for version, machines in sorted(by_version.items(), key=lambda item: str(item[0])):
        if version == mine:
            agreeing.append(f"{len(machines)} execute node{'' if len(machines) == 1 else 's'}")
            continue
        count = f"{len(machines)} execute node{' advertises' if len(machines) == 1 else 's advertise'}"
        findings.append(failed(f"version of the node programs on {_named(machines)}",
                               f"{count} CoSchedNodeVersion {version or '(none: programs older than it)'}, "
                               f"this install is {mine}",
                               "copy this release's node programs to them: `condor-sched install-node` (as root), "
                               "then that directory to COSCHED_NODE_HOOKS on each node; the startd cron advertises "
                               "the new version within 30 s"))
    local = installed_node_version(view)
    if local is not None:
        path, version = local
        if version == mine:
            agreeing.append("this host's node programs")
        else:
            findings.append(failed(f"version of this host's node programs {path}",
                                   f"{version or '(no __version__: an older release)'}, this install is {mine}",
                                   f"as root: condor-sched install-node {view.knob('COSCHED_NODE_HOOKS')} --force "
                                   "(from this release), or copy the node programs from the install host"))
    if not findings:
        findings.append(passed("versions", f"condor_sched {mine} here"
                               + (", on " + ", ".join(agreeing) if agreeing else "")))
    return findings


def check_pool(view: HostView) -> list[Finding]:
    """The collector's view: the sidecar's lease and one release everywhere."""
    fix = ("check COLLECTOR_HOST here (condor_config_val COLLECTOR_HOST) and that the collector answers "
           "(condor_status -collector), then run doctor again")
    ads: dict[str, list[Mapping[str, Any]]] = {}
    for kind in (SIDECAR_ADS, NODE_ADS):
        try:
            ads[kind] = list(view.query_ads(kind))
        except Exception as e:   # htcondor2 raises its own errors, or OSError, for a collector away
            return [failed("collector", f"cannot query {kind} ads: {e}", fix)]
    live, findings = check_lease(view, ads[SIDECAR_ADS])
    return findings + check_versions(view, live, ads[NODE_ADS])


ROLE_CHECKS: dict[str, Callable[[HostView], list[Finding]]] = {
    "sidecar": check_sidecar_host, "schedd": check_schedd, "execute": check_execute_node}


def diagnose(view: HostView, roles: Iterable[str] | None = None) -> Report:
    """Every check of ``roles`` (default: those DAEMON_LIST gives the host), then the pool checks."""
    chosen = tuple(dict.fromkeys(roles)) if roles else tuple(host_roles(view))
    findings: list[Finding] = []
    if not chosen:
        findings.append(passed("host roles", "DAEMON_LIST names none of " + ", ".join(ROLE_DAEMONS.values())
                               + ": only the pool checks ran (--role picks roles)"))
    for role, check in ([(r, ROLE_CHECKS[r]) for r in chosen] + [("pool", check_pool)]):
        try:
            findings += check(view)
        except Exception as e:   # one failing check never hides the others' findings
            findings.append(failed(f"{role} checks", f"doctor could not finish them: {e.__class__.__name__}: {e}",
                                   "fix what the error names and run doctor again"))
    return Report(view.host, chosen, tuple(findings))
