"""The ``condor-sched doctor`` command: the live host's view (htcondor2) handed to :mod:`condor_sched.doctor`."""
from __future__ import annotations

import json
import socket
from typing import Any, Mapping

import click

from condor_sched.doctor import NODE_AD_CONSTRAINT, NODE_AD_PROJECTION, ROLE_DAEMONS, diagnose
from condor_sched.doctor_checks import NODE_ADS, SIDECAR_ADS, HostView


def live_view(node_config: str | None, local_name: str | None = None) -> HostView:
    """This host as its HTCondor configuration (CONDOR_CONFIG, re-read now) and collector show it."""
    import classad2
    import htcondor2

    htcondor2.reload_config()
    param = htcondor2.param

    def query_ads(kind: str) -> list[Mapping[str, Any]]:
        collector = htcondor2.Collector()
        if kind == SIDECAR_ADS:
            # AdType.Any with a constraint: an AdType.Generic query of HTCondor 25 returns none.
            ads = collector.query(htcondor2.AdType.Any, f"MyType == {classad2.quote(SIDECAR_ADS)}")
        elif kind == NODE_ADS:
            ads = collector.query(htcondor2.AdType.Startd, NODE_AD_CONSTRAINT, NODE_AD_PROJECTION)
        else:
            raise ValueError(f"unknown kind of ads {kind!r}")
        return [dict(ad) for ad in ads]

    host = str(param.get("FULL_HOSTNAME") or "").strip() or socket.getfqdn()
    return HostView(param=param, query_ads=query_ads, host=host, node_config_override=node_config,
                    local_name=local_name)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--role", "roles", multiple=True, type=click.Choice(list(ROLE_DAEMONS)),
              help="Check this role (repeatable) instead of those DAEMON_LIST gives the host.")
@click.option("--node-config", type=click.Path(dir_okay=False), default=None,
              help="The node config to check (default: --node-config of COSCHED_HOOK_PREPARE_JOB_ARGS, "
                   "else /etc/condor_sched/node.json).")
@click.option("--local-name", default=None, metavar="NAME",
              help="A host of several startds: check the startd of this local name (e.g. NODE1), its "
                   "NAME.-prefixed knobs first.")
@click.pass_context
def doctor(ctx: click.Context, as_json: bool, roles: tuple[str, ...], node_config: str | None,
           local_name: str | None) -> None:
    """Check what this host's condor_sched roles need; print each problem with its fix.

    Roles come from DAEMON_LIST: SCHEDD (the schedd snippet's transforms and offer knobs),
    STARTD (a condor_sched node's knobs, node config, PREPARE_JOB hook and node agent),
    COSCHED_SIDECAR (the sidecar's program and log). Every host also checks the sidecar's lease
    and that the sidecar, the execute nodes and this host run one condor_sched release. Run it
    as root (it reads root-only state). Exit 0: all is well; 1: problems found; 2: bad usage.
    """
    try:
        view = live_view(node_config, local_name)
    except Exception as e:   # htcondor2 cannot read the configuration
        raise click.ClickException(f"cannot read this host's HTCondor configuration: {e} "
                                   "(fix: set CONDOR_CONFIG, or run doctor on a host of the pool)") from None
    report = diagnose(view, roles)
    click.echo(json.dumps(report.as_json(), indent=2) if as_json else report.text())
    ctx.exit(0 if report.ok else 1)
