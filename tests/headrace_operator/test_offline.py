"""The pure Offline plan: what it does next, from observation only."""

from __future__ import annotations

import dataclasses

import pytest

from headrace_operator.models import PlannedStep
from headrace_operator.offline import (
    Act,
    Decision,
    OfflineFacts,
    decide,
    done_steps,
    node_step,
    orphaned,
    step_states,
)
from headrace_operator.offline_flush import FLUSH_SKIPPED, FlushFacts
from headrace_operator.upgradeplan import NodeStep, OfflineAction, UpgradeNode

OLD, NEW = "node:v1", "node:v2"


def node(i: int, image: str = OLD, **kw: object) -> UpgradeNode:
    values: dict[str, object] = {
        "name": f"c-node-{i}",
        "ordinal": i,
        "image": image,
        "ready": True,
        "registered": True,
        "version": "2.0" if image == NEW else "1.0",
    }
    values.update(kw)
    return UpgradeNode(**values)  # type: ignore[arg-type]


BASE = OfflineFacts(
    nodes=(node(0), node(1)),
    target_image=NEW,
    target_version="2.0",
    marked=False,
    told=False,
    stopped=False,
    ours=False,
    drained="writes are not stopped",
    frozen=(),
    moving=(),
    not_serving="",
)


def at(**changes: object) -> Decision:
    return decide(dataclasses.replace(BASE, **changes))  # type: ignore[arg-type]


def test_the_stages_in_order() -> None:
    assert at().act is Act.STOP
    assert at(stopped=True, ours=True).act is Act.STOP, "the annotation goes with the stop"
    waiting = at(stopped=True, ours=True, marked=True, drained="c-node-1 has 3 append(s) in flight")
    assert (waiting.step, waiting.act) == (OfflineAction.DRAIN_AND_FENCE, Act.WAIT)
    assert "c-node-1 has 3 append(s) in flight" in waiting.why
    ready = {"stopped": True, "ours": True, "marked": True, "drained": ""}
    freeze = at(**ready, frozen=("c-node-0",))
    assert (freeze.act, freeze.nodes) == (Act.FREEZE, ("c-node-1",))
    moving = at(**ready, frozen=("c-node-0", "c-node-1"), moving=("pchannel-001",))
    assert (moving.act, moving.step) == (Act.WAIT, OfflineAction.DRAIN_AND_FENCE)
    tell = at(**ready, frozen=("c-node-0", "c-node-1"))
    assert (tell.step, tell.act) == (OfflineAction.STOP_NODES, Act.TELL)
    told = {**ready, "frozen": ("c-node-0", "c-node-1"), "told": True}
    stopping = at(**told, nodes=(node(0, terminating=True), node(1, image="")))
    assert (stopping.step, stopping.act) == (OfflineAction.STOP_NODES, Act.WAIT)
    assert stopping.why == "stopping node pods: c-node-0"
    starting = at(**told, nodes=(node(0, NEW), node(1, NEW, ready=False)))
    assert (starting.step, starting.act) == (OfflineAction.START_NODES, Act.WAIT)
    assert starting.why.endswith(": c-node-1")
    wrong = at(**told, nodes=(node(0, NEW), node(1, NEW, version="1.0")))
    assert wrong.step is OfflineAction.START_NODES, "back means the target version too"
    back = {**told, "nodes": (node(0, NEW), node(1, NEW))}
    assert (at(**back).act, at(**back).nodes) == (Act.UNFREEZE, ("c-node-0", "c-node-1"))
    served = {**back, "frozen": ()}
    assert at(**served, not_serving="1 pchannel(s) not assigned and serving").act is Act.WAIT
    assert at(**served).act is Act.RESUME
    assert at(**{**served, "stopped": False, "ours": False}).act is Act.FINISH


def test_nothing_to_upgrade_finishes_without_stopping_writes() -> None:
    done = at(nodes=(node(0, NEW), node(1, NEW)))
    assert (done.step, done.act) == (OfflineAction.RESUME_WRITES, Act.FINISH)


def test_a_stop_of_someone_else_is_used_but_never_resumed() -> None:
    theirs = {"stopped": True, "ours": False, "marked": True, "drained": ""}
    assert at(**theirs, frozen=("c-node-0", "c-node-1")).act is Act.TELL
    back = at(**theirs, told=True, nodes=(node(0, NEW), node(1, NEW)))
    assert back.act is Act.FINISH


@pytest.mark.parametrize("stopped", [False, True])
def test_a_lost_stop_is_put_back_before_anything_restarts(stopped: bool) -> None:
    """Someone resumed writes (or the annotation went) mid-plan: the stop
    comes back before the plan goes on."""
    lost = at(stopped=stopped, marked=not stopped, told=True, drained="", nodes=(node(0), node(1)))
    assert lost.act is Act.STOP


def test_rollback_before_anything_restarted_only_resumes() -> None:
    """With rollback the target is the cluster's image, which every node runs."""
    rollback = {"target_image": OLD, "target_version": "1.0", "told": True}
    state = {"stopped": True, "ours": True, "marked": True, "drained": ""}
    assert at(**rollback, **state, frozen=("c-node-0",)).act is Act.UNFREEZE
    assert at(**rollback, **state).act is Act.RESUME


def test_step_states_record_progress_and_keep_start_times() -> None:
    wait = Decision(OfflineAction.STOP_NODES, Act.WAIT, "stopping node pods: c-node-0")
    steps = step_states(wait, ["c-node-0"], [], "2026-11-24T03:00:00Z", FlushFacts())
    assert [(s.action, s.state) for s in steps] == [
        ("stop-writes", "Done"),
        ("drain-and-fence", "Done"),
        ("flush", "Skipped"),
        ("stop-nodes", "Running"),
        ("start-nodes", "Pending"),
        ("resume-writes", "Pending"),
    ]
    assert steps[2].message == FLUSH_SKIPPED and steps[3].message == wait.why
    assert steps[1].nodes == ["c-node-0"] and steps[0].nodes == []
    previous = [PlannedStep(index=3, action="stop-nodes", nodes=[], started="2026-11-24T02:00:00Z")]
    again = step_states(wait, ["c-node-0"], previous, "2026-11-24T03:05:00Z", FlushFacts())
    assert again[3].started == "2026-11-24T02:00:00Z", "first seen running, kept"
    assert again[4].started == ""
    finished = done_steps(["c-node-0"], again, "2026-11-24T03:10:00Z", FlushFacts())
    assert {s.state for s in finished} == {"Done", "Skipped"}


def test_an_offline_plan_that_went_away_is_said_to() -> None:
    assert orphaned("p", None) == "UpgradePlan p no longer exists"
    deleting = {"metadata": {"deletionTimestamp": "2026-11-24T03:00:00Z"}}
    assert orphaned("p", deleting) == "UpgradePlan p is being deleted"
    assert orphaned("p", {"status": {"phase": "Failed"}}) == "UpgradePlan p ended Failed"
    for running in ({}, {"status": {"phase": "Running"}}, {"status": {"phase": "Blocked"}}):
        assert orphaned("p", running) == "", "a Blocked plan keeps its stop (and says so)"


def test_node_steps_follow_the_plan() -> None:
    waiting = Decision(OfflineAction.DRAIN_AND_FENCE, Act.WAIT, "")
    assert node_step(waiting, back=False, was_done=False) is NodeStep.PENDING
    tell = Decision(OfflineAction.STOP_NODES, Act.TELL, "")
    assert node_step(tell, back=False, was_done=False) is NodeStep.RESTARTING
    starting = Decision(OfflineAction.START_NODES, Act.WAIT, "")
    assert node_step(starting, back=False, was_done=False) is NodeStep.RESTARTING
    assert node_step(starting, back=True, was_done=False) is NodeStep.DONE
    assert node_step(waiting, back=True, was_done=True) is NodeStep.DONE, (
        "once Done, a node on the target stays Done"
    )
