"""Gateway tickets: what the portal issues, the agent's gateway accepts, and nothing else."""

from typing import Any

import pytest

from protocol import signing, tickets

TOKEN = "lpn_abcdefghijklmnopqrstuvwxyz012345"
KEY = signing.key_from_token(TOKEN)
KID = signing.token_kid(TOKEN)


def _issue(**kw: Any) -> str:
    args: dict[str, Any] = {
        "node": "gpu1",
        "job_id": 7,
        "attempt": 0,
        "purpose": "http",
        "user": "ana",
    }
    args.update(kw)
    return tickets.issue({KID: KEY}, now=1000.0, **args)


def test_a_ticket_the_portal_issues_passes_at_the_gateway() -> None:
    payload = tickets.verify(KEY, KID, _issue(), node="gpu1", job_id=7, purpose="http", now=1010.0)
    assert payload["user"] == "ana" and payload["job"] == 7


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"node": "gpu2"}, "wrong_node"),
        ({"job_id": 8}, "wrong_job"),
        ({"purpose": "exec"}, "wrong_purpose"),
    ],
)
def test_a_ticket_for_another_node_job_or_purpose_is_refused(
    kw: dict[str, Any], reason: str
) -> None:
    with pytest.raises(tickets.TicketRefused) as caught:
        tickets.verify(KEY, KID, _issue(**kw), node="gpu1", job_id=7, purpose="http", now=1010.0)
    assert caught.value.reason == reason


def test_an_expired_forged_or_missing_ticket_is_refused() -> None:
    good = _issue()
    with pytest.raises(tickets.TicketRefused, match="expired"):
        tickets.verify(KEY, KID, good, node="gpu1", job_id=7, purpose="http", now=1061.0)
    forged = good[:-1] + ("0" if good[-1] != "0" else "1")
    with pytest.raises(tickets.TicketRefused, match="bad_signature"):
        tickets.verify(KEY, KID, forged, node="gpu1", job_id=7, purpose="http", now=1010.0)
    other_key = signing.key_from_token(TOKEN + "x")
    with pytest.raises(tickets.TicketRefused, match="bad_signature"):
        tickets.verify(other_key, KID, good, node="gpu1", job_id=7, purpose="http", now=1010.0)
    for bad in (None, "", "v2.a.b", "v1.two-parts", "v1.a.b.c"):
        with pytest.raises(tickets.TicketRefused):
            tickets.verify(KEY, KID, bad, node="gpu1", job_id=7, purpose="http", now=1010.0)


def test_a_ticket_is_not_a_broker_envelope_signature() -> None:
    # The ticket key is derived apart from the envelope key: a broker signature over the
    # same bytes must not verify as a ticket.
    body = _issue().split(".")[1]
    sig = signing._mac(KEY, task="t", node="gpu1", args={}, ts=1.0, exp=2.0, nonce="n" * 16)
    with pytest.raises(tickets.TicketRefused, match="bad_signature"):
        tickets.verify(KEY, KID, f"v1.{body}.{KID}={sig}", node="gpu1", job_id=7, purpose="http")


def test_a_ticket_opens_the_gateway_while_the_nodes_token_is_rotated() -> None:
    # The portal holds the old and the new token; the agent holds either one of them.
    new_token = "lpn_ZYXWVUTSRQPONMLKJIHGFEDCBA98765"
    new_key, new_kid = signing.key_from_token(new_token), signing.token_kid(new_token)
    ticket = tickets.issue(
        {KID: KEY, new_kid: new_key},
        node="gpu1",
        job_id=7,
        attempt=0,
        purpose="http",
        user="ana",
        now=1000.0,
    )
    for key, kid in ((KEY, KID), (new_key, new_kid)):
        assert tickets.verify(key, kid, ticket, node="gpu1", job_id=7, purpose="http", now=1001.0)
    retired = signing.key_from_token(TOKEN[:-1] + "9")
    with pytest.raises(tickets.TicketRefused, match="not signed with this node's token"):
        tickets.verify(retired, "lpn_retire", ticket, node="gpu1", job_id=7, purpose="http")
