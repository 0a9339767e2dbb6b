"""The local stack's side of multi-node jobs, in one process: the runner's rendezvous on this machine,
the timeline's words for a gang's launches, and the gang scenario's arguments and readings."""

from __future__ import annotations

from typing import Any

from spotguard_cli.emulator.runner import node_words, rendezvous_here
from spotguard_cli.emulator.timeline import runtask_line, runtask_outcome_line
from spotguard_cli.local import demo as localcmd
from spotguard_cli.local.gang_nodes import STARTED_BY, free_port
from spotguard_cli.local.gang_proof import STOPPED_ON, ranks_in
from spotguard_cli.main import build_parser


def _node_env(rank: int, address: str | None = "10.8.0.17") -> dict[str, str]:
    env = {
        "SPOTGUARD_NODE_RANK": str(rank),
        "SPOTGUARD_NODES": "2",
        "PET_NNODES": "2",
        "PET_NODE_RANK": str(rank),
        "PET_MASTER_PORT": "29517",
        "PATH": "/usr/bin",
    }
    if rank > 0 and address:
        env |= {"PET_MASTER_ADDR": address, "SPOTGUARD_RENDEZVOUS": f"{address}:29517"}
    return env


def test_a_node_finds_node_0_at_127_0_0_1_since_every_local_instance_is_this_machine():
    env, said = rendezvous_here(_node_env(1))
    assert env["PET_MASTER_ADDR"] == "127.0.0.1" and env["SPOTGUARD_RENDEZVOUS"] == "127.0.0.1:29517"
    assert {k: v for k, v in env.items() if k not in ("PET_MASTER_ADDR", "SPOTGUARD_RENDEZVOUS")} == {
        k: v for k, v in _node_env(1).items() if k not in ("PET_MASTER_ADDR", "SPOTGUARD_RENDEZVOUS")
    }
    assert said == "10.8.0.17:29517 is 127.0.0.1:29517 here (every instance is this machine)"
    # node 0 hosts the rendezvous (torchrun's default address, itself), and a one-node task has none
    assert rendezvous_here(_node_env(0)) == (_node_env(0), "")
    assert rendezvous_here({"PATH": "/usr/bin"}) == ({"PATH": "/usr/bin"}, "")
    # either name alone is mapped too
    only = rendezvous_here({"SPOTGUARD_RENDEZVOUS": "10.0.0.9:29600"})
    assert only == ({"SPOTGUARD_RENDEZVOUS": "127.0.0.1:29600"}, only[1]) and "10.0.0.9:29600" in only[1]


def test_a_gang_s_task_and_its_runtask_say_which_node_they_are():
    assert node_words(_node_env(1)) == " (node 1 of 2)"
    assert node_words({"SPOTGUARD_NODE_RANK": "0", "SPOTGUARD_NODES": "1"}) == ""
    assert node_words({}) == ""

    def runtask(env: dict[str, str], constraints: list[dict[str, Any]]) -> dict[str, Any]:
        overrides = [{"name": "main", "environment": [{"name": k, "value": v} for k, v in env.items()]}]
        return {"overrides": {"containerOverrides": overrides}, "placementConstraints": constraints}

    first = {"SPOTGUARD_ATTEMPT": "2", **_node_env(0)}
    assert runtask_line(runtask(first, [])) == "  RunTask attempt 2 node 0 of 2 from scratch"
    peer = {"SPOTGUARD_ATTEMPT": "2", **_node_env(1)}
    beside = [{"type": "memberOf", "expression": "ec2InstanceId !in [i-0a, i-0b]"}]
    assert (
        runtask_line(runtask(peer, beside)) == "  RunTask attempt 2 node 1 of 2 off [i-0a, i-0b] from scratch"
    )
    nothing = {"tasks": [], "failures": [{"reason": "RESOURCE:GPU"}]}
    assert runtask_outcome_line(runtask(peer, beside), nothing) == (
        "  RunTask placed no task for node 1: RESOURCE:GPU (no instance with a free GPU)"
    )
    # a one-node job's line is as it was
    assert runtask_line(runtask({"SPOTGUARD_ATTEMPT": "1"}, beside)) == "  RunTask attempt 1 from scratch"


def test_the_gang_scenario_gets_its_defaults_and_refuses_what_is_not_its():
    args = build_parser().parse_args(["local", "demo", "--scenario", "gang"])
    assert localcmd.demo_arguments(args) is None
    assert (args.steps, args.interrupt_at, args.step_seconds) == (60, 25, 0.1)
    scaled = build_parser().parse_args(["local", "demo", "--scenario", "gang", "--time-scale", "5"])
    assert localcmd.demo_arguments(scaled) == "argument --time-scale: is for --scenario capacity"
    late = build_parser().parse_args(["local", "demo", "--scenario", "gang", "--steps", "10"])
    assert "a step from 0 to 8, not 25" in (localcmd.demo_arguments(late) or "")


def test_the_scenario_reads_nodes_checkpoints_and_ranks():
    assert STARTED_BY.fullmatch("spotguard/gang/2")["node"] is None  # type: ignore[index]
    assert STARTED_BY.fullmatch("spotguard/gang/2/1")["node"] == "1"  # type: ignore[index]
    said = (
        "spotguard-agent: stopped on committed checkpoint 3 (step 27; committed the stop checkpoint): exit 75"
    )
    assert STOPPED_ON.search(said).groups() == ("3", "27")  # type: ignore[union-attr]
    files = [
        {"path": ".metadata"},
        {"path": "__0_0.distcp"},
        {"path": "__1_0.distcp"},
        {"path": "__1_1.distcp"},
    ]
    assert ranks_in({"files": files}) == {0, 1} and ranks_in(None) == set()
    port = free_port()
    assert 29500 <= port < 30500 and free_port(port, taken=(port,)) != port
