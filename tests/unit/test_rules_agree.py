"""The planner and the execute node accept and refuse exactly the same requests (issue 10).

Before, the sidecar pinned jobs the PREPARE_JOB hook then held (RequestPhiThreads 0 or 2.5):
the two sides had their own checks. Both now call ``cosched_node.rules``; these properties
drive the planner's check (``classads.request_problem``, on evaluated values) and the hook's
(``prepare_job.device_demand`` / ``spread_demand`` on the job ad text the starter hands it,
and the agent's check of a claim's allocation) with the same hostile values.
"""
from __future__ import annotations

import io
import json

import pytest
from cosched_node import agent, ads, config, prepare_job, rules
from cosched_node.errors import AdError
from cosched_node.slots import Claim
from hypothesis import given, settings
from hypothesis import strategies as st

from condor_sched import classads
from condor_sched.device_kinds import PHI

NODE = config.parse_node_config({
    "node": "node1", "domain": "cosched.test", "cores": 8, "memory_mb": 8192,
    "slots": [{"kind": "socket", "slot_id": 1, "cores": 4, "memory_mb": 4096, "cache_id": 0, "llc_ways": 11,
               "mem_bw_gbs": 50},
              {"kind": "device", "slot_id": 2, "cores": 4, "memory_mb": 4096, "device": "mic0",
               "device_memory_mb": 8192, "hardware_threads": 240}]})

values = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 300), st.integers(10**5 - 2, 10**5 + 2),
    st.integers(10**12 - 1, 10**12 + 1), st.sampled_from([0.0, 1.0, 2.5, 60.0, -1.0, 1e13, 1024.5]),
    st.sampled_from(["", "abc", "60", "MG", ".x", "a b", "x" * 65]))


def _literal(value: object) -> str | None:
    """``value`` as the starter writes it into the job ad text, None for undefined."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def _job_ad(**attrs: object) -> dict:
    lines = ["ClusterId = 7", "ProcId = 0"] + [f"{k} = {_literal(v)}" for k, v in attrs.items() if v is not None]
    return ads.parse_classad("\n".join(lines), "job ad")


def _hook_accepts(check) -> bool:
    try:
        check()
        return True
    except AdError:
        return False


@settings(max_examples=400, deadline=None)
@given(memory=values, compute=values)
def test_planner_and_hook_accept_the_same_device_requests(memory, compute):
    planner_ok = classads.request_problem(PHI, memory=memory, compute=compute) is None
    ad = _job_ad(RequestPhiMemory=memory, RequestPhiThreads=compute)
    hook_ok = _hook_accepts(lambda: prepare_job.device_demand(ad, NODE.device("mic0")))
    assert planner_ok == hook_ok, (memory, compute)


@settings(max_examples=300, deadline=None)
@given(program=values, cpus=values)
def test_planner_and_hook_accept_the_same_spread_requests(program, cpus):
    planner_ok = classads.request_problem(None, program=program, cpus=cpus) is None
    ad = _job_ad(CoSchedProgram=program, RequestCpus=cpus)
    hook_ok = _hook_accepts(lambda: prepare_job.spread_demand(ad, NODE, "slot1_1"))
    assert planner_ok == hook_ok, (program, cpus)


@settings(max_examples=300, deadline=None)
@given(memory=st.integers(0, 10**12 + 5), compute=st.integers(0, 10**5 + 5))
def test_the_agent_refuses_a_claim_allocation_exactly_when_the_planner_refuses_the_request(memory, compute):
    """The startd evaluates a request into the claim's integer allocation; the agent checks it
    by the same rules (a request the hook could not read, e.g. an expression, ends there)."""
    claim = Claim(slot="slot2_1", slot_id=2, job="7.0", starter_pid=1234, remote_user="alice", cpus=1,
                  memory_mb=0, device="mic0", device_memory_mb=memory, compute=compute, llc_ways=0,
                  mem_bw_gbs=0.0, program=None, pinned=True, scale=0, nodes=0)
    planner_problem = classads.request_problem(PHI, memory=memory, compute=compute)
    agent_problem = agent.device_problem(NODE, claim)
    is_device_job = memory != 0
    assert (agent_problem is None) == (planner_problem is None and is_device_job), (memory, compute)


@pytest.mark.parametrize(("memory", "compute"), [(1024, 0), (1024, 2.5), (1024.5, 60), (-5, 60), ("abc", 60)])
def test_requests_the_issue_found_pinned_then_held_are_refused_by_both(memory, compute):
    assert classads.request_problem(PHI, memory=memory, compute=compute) is not None
    with pytest.raises(AdError):
        prepare_job.device_demand(_job_ad(RequestPhiMemory=memory, RequestPhiThreads=compute),
                                  NODE.device("mic0"))


def test_an_expression_request_is_left_to_the_startd_and_checked_on_the_claim():
    ad = ads.parse_classad(io.StringIO("ClusterId = 7\nProcId = 0\nRequestPhiMemory = 1000 + 24\n"
                                       "RequestPhiThreads = 60\n").read(), "job ad")
    assert prepare_job.device_demand(ad, NODE.device("mic0")) == prepare_job.EVALUATED_BY_THE_STARTD
    assert rules.device_request("RequestPhiMemory", 1024, "RequestPhiThreads", 60) == (1024, 60)
