"""The flush step of the Offline plan, pure: when it requests, what it waits
on, what it records, and what ``status.plan`` says of it."""

from __future__ import annotations

import dataclasses

import headrace.wal.local  # noqa: F401 - registers the local: message ids
from headrace.client.flushing import FlushRequested, progress
from headrace.message.ids import parse
from headrace.table.records import CheckpointRecord
from headrace_operator.models import FlushTarget, UpgradeFlush
from headrace_operator.offline import Act, decide, step_states
from headrace_operator.offline_flush import (
    FLUSH_SKIPPED,
    ROLLED_BACK_UNFLUSHED,
    FlushFacts,
    FlushNext,
    new_record,
    next_flush,
    observed_record,
    previous_record,
    recorded_targets,
    requested_why,
    runs_problem,
)
from headrace_operator.upgradeplan import OfflineAction
from tests.headrace_operator.test_offline import BASE, NEW, OLD, node

NOW = "2026-11-24T03:00:00Z"
LATER = "2026-11-24T03:02:00Z"
FENCED = dataclasses.replace(
    BASE,
    stopped=True,
    ours=True,
    marked=True,
    drained="",
    frozen=("c-node-0", "c-node-1"),
)
"""Writes stopped, nothing in flight, every node frozen, nothing moving."""


def cp(pchannel: str, position: str) -> CheckpointRecord:
    return CheckpointRecord(pchannel=pchannel, position=position)


REQUESTED = FlushRequested(
    ("orders", "users"),
    {"pchannel-001": parse("local:40"), "pchannel-000": parse("local:17")},
)
RECORD = new_record(REQUESTED, NOW)


def flush_facts(checkpoints: dict[str, CheckpointRecord | None], **kw: object) -> FlushFacts:
    targets, problem = recorded_targets(RECORD)
    assert problem == ""
    state = progress(targets, checkpoints)
    record = observed_record(RECORD, checkpoints, state, LATER)
    return FlushFacts(configured=True, record=record, progress=state, **kw)  # type: ignore[arg-type]


def test_without_a_flush_section_the_nodes_stop_right_after_the_fence() -> None:
    decision = decide(FENCED)
    assert (decision.step, decision.act) == (OfflineAction.STOP_NODES, Act.TELL)
    steps = step_states(decision, ["c-node-0"], [], NOW, FlushFacts())
    flush = steps[2]
    assert (flush.action, flush.state, flush.message) == ("flush", "Skipped", FLUSH_SKIPPED)
    assert "no flush configured" in FLUSH_SKIPPED and "drained and fenced" in FLUSH_SKIPPED


def test_with_a_flush_section_the_plan_requests_once_fenced() -> None:
    configured = FlushFacts(configured=True)
    decision = decide(dataclasses.replace(FENCED, flush=configured))
    assert (decision.step, decision.act) == (OfflineAction.FLUSH, Act.FLUSH)
    assert decision.why == "requesting a flush of every collection"
    steps = step_states(decision, ["c-node-0"], [], NOW, configured)
    assert [(s.action, s.state) for s in steps] == [
        ("stop-writes", "Done"),
        ("drain-and-fence", "Done"),
        ("flush", "Running"),
        ("stop-nodes", "Pending"),
        ("start-nodes", "Pending"),
        ("resume-writes", "Pending"),
    ]


def test_no_flush_is_requested_before_every_node_is_fenced() -> None:
    configured = FlushFacts(configured=True)
    for early in (
        dataclasses.replace(FENCED, drained="c-node-1 has 2 append(s) in flight"),
        dataclasses.replace(FENCED, frozen=("c-node-0",)),
        dataclasses.replace(FENCED, moving=("pchannel-002",)),
        dataclasses.replace(FENCED, stopped=False),
    ):
        decision = decide(dataclasses.replace(early, flush=configured))
        assert decision.act is not Act.FLUSH, early
        assert decision.step in (OfflineAction.STOP_WRITES, OfflineAction.DRAIN_AND_FENCE)


def test_the_plan_waits_on_the_pchannels_behind_and_names_them() -> None:
    behind = flush_facts({"pchannel-000": cp("pchannel-000", "local:17"), "pchannel-001": None})
    decision = decide(dataclasses.replace(FENCED, flush=behind))
    assert (decision.step, decision.act) == (OfflineAction.FLUSH, Act.WAIT)
    assert decision.why.startswith("waiting on pchannel-001 to flush up to the plan's request")
    assert "pchannel-001 checkpoint no checkpoint yet, needs local:40" in decision.why
    assert "pchannel-000" not in decision.why
    failing = dataclasses.replace(behind, runs="FlushRunsFailing: pchannel-001 failed 3 times")
    why = decide(dataclasses.replace(FENCED, flush=failing)).why
    assert why.endswith("(the cluster's flush runs: FlushRunsFailing: pchannel-001 failed 3 times)")
    partly = flush_facts(
        {"pchannel-000": cp("pchannel-000", "local:20"), "pchannel-001": cp("p", "local:39")}
    )
    assert (
        "pchannel-001 checkpoint at local:39, needs local:40"
        in decide(dataclasses.replace(FENCED, flush=partly)).why
    )


def test_every_checkpoint_at_its_target_lets_the_nodes_stop_and_the_step_is_done() -> None:
    reached = flush_facts(
        {"pchannel-000": cp("pchannel-000", "local:17"), "pchannel-001": cp("p", "local:41")}
    )
    assert reached.done and next_flush(reached).next is FlushNext.PROCEED
    decision = decide(dataclasses.replace(FENCED, flush=reached))
    assert (decision.step, decision.act) == (OfflineAction.STOP_NODES, Act.TELL)
    flush = step_states(decision, ["c-node-0"], [], LATER, reached)[2]
    assert flush.state == "Done"
    assert flush.message == (
        "flushed 2 collection(s): every checkpoint reached the plan's flush request "
        "(pchannel-000 at local:17, pchannel-001 at local:41)"
    )


def test_an_unreadable_checkpoint_is_waited_on_with_the_reason() -> None:
    broken = FlushFacts(
        configured=True, record=RECORD, unreadable="checkpoint of pchannel-001 is at memory:3"
    )
    decision = decide(dataclasses.replace(FENCED, flush=broken))
    assert (decision.step, decision.act) == (OfflineAction.FLUSH, Act.WAIT)
    assert decision.why == "waiting on the flush: checkpoint of pchannel-001 is at memory:3"


def test_a_cluster_without_collections_has_nothing_to_wait_for() -> None:
    record = new_record(FlushRequested((), {}), NOW)
    assert record.done == NOW and record.pchannels == []
    state = progress({}, {})
    empty = FlushFacts(configured=True, record=record, progress=state)
    assert decide(dataclasses.replace(FENCED, flush=empty)).act is Act.TELL
    steps = step_states(decide(dataclasses.replace(FENCED, flush=empty)), [], [], NOW, empty)
    assert (steps[2].state, steps[2].message) == ("Done", "0 collection(s), nothing to flush")


def test_a_rollback_before_the_flush_finished_skips_it_and_says_so() -> None:
    rolling_back = dataclasses.replace(
        FENCED, target_image=OLD, target_version="1.0", told=True, frozen=()
    )
    behind = flush_facts({"pchannel-000": None, "pchannel-001": None})
    decision = decide(dataclasses.replace(rolling_back, flush=behind))
    assert decision.act is Act.RESUME, "a rollback resumes writes without waiting on the flush"
    flush = step_states(decision, [], [], NOW, behind)[2]
    assert (flush.state, flush.message) == ("Skipped", ROLLED_BACK_UNFLUSHED)


def test_the_nodes_already_told_never_go_back_to_the_flush() -> None:
    """Once the nodes stop, a flush record that is not complete (a checkpoint
    read as behind after a restart) does not hold anything up."""
    behind = flush_facts({"pchannel-000": None, "pchannel-001": None})
    told = dataclasses.replace(
        FENCED, told=True, flush=behind, nodes=(node(0, NEW, ready=False), node(1, NEW))
    )
    assert decide(told).step is OfflineAction.START_NODES


def test_a_flush_seen_done_stays_done_when_a_later_read_fails() -> None:
    """Once every checkpoint was seen at its target (``done`` recorded), a
    checkpoint read that fails later does not turn the step into a skip."""
    seen_done = RECORD.model_copy(update={"done": LATER})
    later = FlushFacts(configured=True, record=seen_done, unreadable="etcd timed out")
    assert later.done
    finish = decide(dataclasses.replace(FENCED, told=True, flush=later))
    assert step_states(finish, [], [], NOW, later)[2].state == "Done"
    assert not FlushFacts(configured=True, record=RECORD, unreadable="etcd timed out").done


def test_the_record_round_trips_and_is_rebuilt_from_the_checkpoints() -> None:
    assert RECORD.requested == NOW and RECORD.collections == 2 and RECORD.done == ""
    assert [(t.pchannel, t.target) for t in RECORD.pchannels] == [
        ("pchannel-000", "local:17"),
        ("pchannel-001", "local:40"),
    ]
    targets, problem = recorded_targets(RECORD)
    assert problem == "" and targets == dict(REQUESTED.targets)
    status = {"flush": RECORD.model_dump(by_alias=True)}
    assert previous_record(status) == (RECORD, "")
    assert previous_record({}) == (None, "")
    bad, why = previous_record({"flush": {"pchannels": "nope"}})
    assert bad is None and why.startswith("status.flush does not parse")
    checkpoints = {"pchannel-000": cp("pchannel-000", "local:30"), "pchannel-001": None}
    state = progress(targets, checkpoints)
    seen = observed_record(RECORD, checkpoints, state, LATER)
    assert [(t.checkpoint, t.reached) for t in seen.pchannels] == [("local:30", True), ("", False)]
    assert seen.done == "" and seen.requested == NOW, "the request time is kept"
    done_now = {"pchannel-000": cp("a", "local:30"), "pchannel-001": cp("b", "local:40")}
    done = observed_record(seen, done_now, progress(targets, done_now), LATER)
    assert done.done == LATER
    assert observed_record(done, done_now, progress(targets, done_now), "later").done == LATER


def test_a_target_edited_into_garbage_is_refused_with_its_pchannel() -> None:
    edited = UpgradeFlush(
        requested=NOW, pchannels=[FlushTarget(pchannel="pchannel-003", target="nonsense")]
    )
    targets, problem = recorded_targets(edited)
    assert targets == {}
    assert problem.startswith("status.flush: target of pchannel-003: malformed message id")


def test_the_clusters_flush_health_is_quoted_only_when_false() -> None:
    def cluster(status: str) -> dict[str, object]:
        condition = {
            "type": "FlushHealthy",
            "status": status,
            "reason": "FlushBlocked",
            "message": "no SparkApplication API is served",
        }
        return {"status": {"conditions": [condition]}}

    assert runs_problem(cluster("False")) == "FlushBlocked: no SparkApplication API is served"
    assert runs_problem(cluster("True")) == ""
    assert runs_problem(None) == "" and runs_problem({}) == ""


def test_the_message_right_after_the_request_names_the_pchannels() -> None:
    assert requested_why(RECORD) == (
        "flush of 2 collection(s) requested; waiting until the checkpoints reach it: "
        "pchannel-000, pchannel-001"
    )
