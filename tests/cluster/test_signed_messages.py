"""Both directions of the agent protocol are signed with the node token's key.

Reports an agent sends are checked before anything else is believed; commands
the portal sends carry a signature the agent's own check accepts.
"""

from __future__ import annotations

from typing import Any

import pytest
import time_machine
from django.core.cache import cache
from django.utils import timezone

from cluster.models import NodeToken, RejectedMessage
from cluster.signing import NODE_KEYS_CACHE_S
from cluster.tasks import command_refused, node_heartbeat, node_register
from protocol.signing import CommandVerifier, key_from_token, sign, token_kid
from scheduling import dispatch
from tests.cluster.conftest import gpu_entry, job_on, register_info

HEARTBEAT = {"ts": 1.0, "running_job_ids": []}


def signed_report(task: str, node: str, args: list[Any], token: str, **kw: Any) -> dict:
    return sign(
        key_from_token(token),
        kid=token_kid(token),
        task=task,
        node=node,
        args=args,
        ttl_s=kw.get("ttl_s", 600),
        now=kw.get("now"),
    )


def test_a_report_signed_with_the_nodes_token_is_accepted_and_its_replay_refused(
    issue_token: Any,
) -> None:
    secret = issue_token("gpu01")
    info = register_info(gpu_entry("GPU-aaa"))
    auth = signed_report("control.node_register", "gpu01", [info], secret)

    assert node_register("gpu01", auth, info) == "ok"
    assert node_register("gpu01", auth, info) == "refused: bad_token"
    rejected = RejectedMessage.objects.get(node_name="gpu01", message="node_register")
    assert rejected.last_detail.startswith("replayed")


@pytest.mark.parametrize("case", ["other_nodes_token", "tampered", "expired", "revoked"])
def test_a_report_that_is_forged_stale_or_from_a_revoked_token_is_refused(
    registered_node: Any, issue_token: Any, case: str
) -> None:
    _node, secret = registered_node
    info: dict[str, Any] = dict(HEARTBEAT)
    now = None
    token = secret
    if case == "other_nodes_token":
        token = issue_token("gpu02")
    if case == "expired":
        now = timezone.now().timestamp() - 3600
    auth = signed_report("control.node_heartbeat", "gpu01", [info], token, now=now)
    if case == "tampered":
        info = {"ts": 1.0, "running_job_ids": [99]}
    if case == "revoked":
        NodeToken.objects.filter(node_name="gpu01").revoke()

    assert node_heartbeat("gpu01", auth, info) == "refused: bad_token"
    assert RejectedMessage.objects.filter(
        node_name="gpu01", message="node_heartbeat", reason=RejectedMessage.Reason.BAD_TOKEN
    ).exists()


def heartbeat_from_gpu01(secret: str) -> str:
    """A freshly signed heartbeat (a new nonce each time), as the agent sends one."""
    info = dict(HEARTBEAT)
    return node_heartbeat(
        "gpu01", signed_report("control.node_heartbeat", "gpu01", [info], secret), info
    )


def test_a_token_revoked_in_the_portal_is_refused_at_once_though_its_keys_were_cached(
    registered_node: Any,
) -> None:
    _node, secret = registered_node
    assert heartbeat_from_gpu01(secret) == "ok"  # the worker now holds gpu01's keys

    NodeToken.objects.filter(node_name="gpu01").revoke()

    assert heartbeat_from_gpu01(secret) == "refused: bad_token"


@pytest.mark.parametrize("how", ["edited", "deleted"])
def test_a_token_revoked_or_deleted_through_its_model_is_refused_at_once(
    registered_node: Any, how: str
) -> None:
    _node, secret = registered_node
    assert heartbeat_from_gpu01(secret) == "ok"
    token = NodeToken.objects.get(node_name="gpu01")

    if how == "edited":  # as the admin's change form saves it
        token.revoked_at = timezone.now()
        token.save()
    else:
        token.delete()

    assert heartbeat_from_gpu01(secret) == "refused: bad_token"


def test_a_revocation_in_another_worker_reaches_this_one_through_the_shared_cache(
    registered_node: Any,
) -> None:
    _node, secret = registered_node
    assert heartbeat_from_gpu01(secret) == "ok"

    # Another process revokes: the row changes, and so does the shared generation
    # value; this process's own memory is untouched.
    NodeToken.objects.filter(node_name="gpu01").update(revoked_at=timezone.now())
    cache.set("labportal:node-keys-generation", "changed by another worker", timeout=None)

    assert heartbeat_from_gpu01(secret) == "refused: bad_token"


def test_a_revocation_that_bypasses_the_portal_takes_effect_within_the_cache_bound(
    registered_node: Any,
) -> None:
    _node, secret = registered_node
    with time_machine.travel(timezone.now(), tick=False) as clock:
        assert heartbeat_from_gpu01(secret) == "ok"
        # SQL behind the portal's back: no worker is told.
        NodeToken.objects.filter(node_name="gpu01").update(revoked_at=timezone.now())

        clock.shift(NODE_KEYS_CACHE_S + 1)

        assert heartbeat_from_gpu01(secret) == "refused: bad_token"


def test_a_new_token_is_accepted_at_once_while_the_old_ones_keys_are_cached(
    registered_node: Any, issue_token: Any
) -> None:
    _node, old = registered_node
    assert heartbeat_from_gpu01(old) == "ok"

    new = issue_token("gpu01")  # rotation: the agent restarts with a new token

    assert heartbeat_from_gpu01(new) == "ok"
    assert heartbeat_from_gpu01(old) == "ok"  # both active until the old one is revoked


def test_the_signing_keys_are_not_put_in_the_shared_cache(registered_node: Any) -> None:
    _node, secret = registered_node
    assert heartbeat_from_gpu01(secret) == "ok"

    stored = b"".join(cache._cache.values())  # type: ignore[attr-defined]  # locmem, pickled
    token = NodeToken.objects.get(node_name="gpu01")
    assert stored  # the nonce and the generation value are there
    for secret_bytes in (key_from_token(secret), token.token_hash.encode()):
        assert secret_bytes not in stored and secret_bytes.hex().encode() not in stored


def test_an_agents_refusal_of_a_command_is_shown_to_admins(registered_node: Any) -> None:
    _node, secret = registered_node
    args = ["agent.start_job", "unsigned", "the message carries no signature"]
    auth = signed_report("control.command_refused", "gpu01", args, secret)

    assert command_refused("gpu01", auth, *args) == "ok"

    row = RejectedMessage.objects.get(reason=RejectedMessage.Reason.FORGED_COMMAND)
    assert row.node_name == "gpu01" and row.message == "agent refused agent.start_job"
    assert "unsigned" in row.last_detail


def test_a_monitor_only_agents_refusal_is_not_taken_for_a_forgery(registered_node: Any) -> None:
    _node, secret = registered_node
    args = ["agent.start_job", "monitor_only", "node gpu01's agent is monitor-only"]
    auth = signed_report("control.command_refused", "gpu01", args, secret)

    assert command_refused("gpu01", auth, *args) == "ok"

    (row,) = RejectedMessage.objects.filter(node_name="gpu01")
    assert row.reason == RejectedMessage.Reason.MONITOR_ONLY and "monitor-only" in row.last_detail


def test_commands_to_an_agent_are_signed_so_that_only_its_node_accepts_them(
    registered_node: Any,
    alice: Any,
    sent_tasks: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    node, secret = registered_node
    job = job_on(node, alice, state="running")
    with django_capture_on_commit_callbacks(execute=True):
        dispatch.send_stop(node=node, job_id=job.pk, grace_s=10, reason="cancelled")
        dispatch.send_logs_request(node=node, job_id=job.pk)

    (stop_i, logs_i) = range(len(sent_tasks))
    name, args, queue = sent_tasks[stop_i]
    assert (name, queue) == ("agent.stop_job", "node.gpu01")
    auth = sent_tasks.kwargs[stop_i]["auth"]
    CommandVerifier(secret, "gpu01").verify("agent.stop_job", args, auth)
    # The same signature is worth nothing for another node or another command.
    with pytest.raises(Exception, match="bad_signature"):
        CommandVerifier(secret, "gpu02").verify("agent.stop_job", args, auth)
    logs_args = sent_tasks[logs_i][1]
    with pytest.raises(Exception, match="bad_signature"):
        CommandVerifier(secret, "gpu01").verify("agent.job_logs", logs_args, auth)


def test_a_job_gets_no_network_unless_its_queue_allows_egress(
    registered_node: Any, alice: Any
) -> None:
    node, _secret = registered_node
    job = job_on(node, alice, state="dispatched")

    assert dispatch.start_spec(job, [])["network"] == "none"
    job.queue.network_egress = True
    job.queue.save()
    job.refresh_from_db()
    assert dispatch.start_spec(job, [])["network"] == "egress"


def test_a_bare_token_is_still_accepted_from_an_agent_of_an_earlier_release(
    issue_token: Any,
) -> None:
    secret = issue_token("gpu01")
    assert node_register("gpu01", secret, register_info()) == "ok"
    assert node_register("gpu01", "lpn_wrong", register_info()) == "refused: bad_token"


def test_a_token_revoked_or_issued_changes_the_next_commands_signature_at_once(
    registered_node: Any, alice: Any, sent_tasks: Any, django_capture_on_commit_callbacks: Any
) -> None:
    # The process keeps the node's keys for commands too: a revocation must not wait for them.
    node, secret = registered_node
    job = job_on(node, alice, state="running")

    def stop() -> tuple[list[Any], dict[str, Any]]:
        with django_capture_on_commit_callbacks(execute=True):
            dispatch.send_stop(node=node, job_id=job.pk, grace_s=10, reason="cancelled")
        return sent_tasks[-1][1], sent_tasks.kwargs[-1]["auth"]

    args, auth = stop()
    CommandVerifier(secret, "gpu01").verify("agent.stop_job", args, auth)  # keys now cached

    # Revoked by another process: only the shared generation value tells this one.
    NodeToken.objects.filter(node_name="gpu01").update(revoked_at=timezone.now())
    cache.set("labportal:node-keys-generation", "changed by another worker", timeout=None)
    args, auth = stop()
    with pytest.raises(Exception, match="not signed with this node.s token"):
        CommandVerifier(secret, "gpu01").verify("agent.stop_job", args, auth)

    _token, new_secret = NodeToken.issue(node_name="gpu01")
    args, auth = stop()
    CommandVerifier(new_secret, "gpu01").verify("agent.stop_job", args, auth)
