"""Node tokens from the command line, for enrolling GPU servers with Ansible and the like.

    manage.py node_token issue gpu-01 [--name "rack 3"]   # prints the secret, once
    manage.py node_token list [--all]
    manage.py node_token revoke gpu-01                      # every live token of the node

`issue` prints only the secret on standard output (``--json`` for the token's record too),
so a playbook can capture it: ``LABPORTAL_NODE_TOKEN=$(manage.py node_token issue gpu-01)``.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.validators import validate_slug

from cluster.models import NodeToken


class Command(BaseCommand):
    help = "Issue, list or revoke the node tokens agents present (an enrolment step)."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        issue = actions.add_parser(
            "issue", help="Issue a token for a node; prints its secret once."
        )
        issue.add_argument("node", help="The node's name, as its agent registers (e.g. gpu-01).")
        issue.add_argument("--name", default="", help="A label for the token (default: the node).")
        issue.add_argument(
            "--json", action="store_true", help="Print a JSON record with the secret."
        )
        listing = actions.add_parser("list", help="List the live tokens (--all: revoked ones too).")
        listing.add_argument("--all", action="store_true")
        revoke = actions.add_parser("revoke", help="Revoke every live token of a node.")
        revoke.add_argument("node")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "issue":
            self._issue(options["node"], options["name"], as_json=options["json"])
        elif action == "list":
            self._list(include_revoked=options["all"])
        else:
            self._revoke(options["node"])

    def _issue(self, node: str, name: str, *, as_json: bool) -> None:
        try:
            validate_slug(node)
        except ValidationError as exc:
            raise CommandError(
                f"{node!r} is not a node name: use letters, digits, hyphens and underscores "
                "(e.g. gpu-01), as the agent's --name"
            ) from exc
        if len(node) > 63 or len(name) > 80:
            raise CommandError("A node name has at most 63 characters, a token name 80.")
        token, secret = NodeToken.issue(node_name=node, name=name)
        if as_json:
            record = {"node": node, "name": token.name, "prefix": token.token_prefix}
            self.stdout.write(json.dumps({**record, "token": secret}))
        else:
            self.stdout.write(secret)
        self.stderr.write(
            f"Issued a token for {node} ({token.token_prefix}…). Give it to the agent as "
            "LABPORTAL_NODE_TOKEN; it is not shown again."
        )

    def _list(self, *, include_revoked: bool) -> None:
        tokens = NodeToken.objects.all()
        if not include_revoked:
            tokens = tokens.filter(revoked_at__isnull=True)
        for token in tokens:
            state = f"revoked {token.revoked_at:%Y-%m-%d %H:%M}" if token.revoked_at else "live"
            created = f"{token.created_at:%Y-%m-%d %H:%M}"
            self.stdout.write(f"{token.node_name}\t{token.token_prefix}…\t{created}\t{state}")

    def _revoke(self, node: str) -> None:
        revoked = NodeToken.objects.filter(node_name=node).revoke()
        if not revoked:
            raise CommandError(f"{node} has no live node token (manage.py node_token list --all).")
        self.stdout.write(
            f"Revoked {revoked} token(s) of {node}; its agent is refused from now on."
        )
