"""Job arrays in the web form: "0-9" or "1,4,7" (the syntax of ``labctl submit --array``),
each job told its index in LABPORTAL_ARRAY_INDEX, all submitted as one batch."""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext as _

from jobqueue.submit import MAX_BATCH

ARRAY_INDEX_ENV = "LABPORTAL_ARRAY_INDEX"


def array_indices(text: str) -> list[int]:
    """The indices of an array spec, each once and in order; ValueError says what to fix."""
    indices: list[int] = []
    for part in text.split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        low, high = low.strip(), high.strip()
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(
                _("“%(text)s” is not an array range: use 0-9, 1,4,7 or 0-3,10.") % {"text": text}
            )
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ValueError(
                _("“%(part)s” counts down; write it as %(last)d-%(first)d.")
                % {"part": part, "last": last, "first": first}
            )
        if len(indices) + last - first + 1 > MAX_BATCH:
            raise ValueError(
                _("An array holds at most %(max)d jobs; “%(text)s” has more.")
                % {"max": MAX_BATCH, "text": text}
            )
        indices.extend(range(first, last + 1))
    return list(dict.fromkeys(indices))


def array_specs(spec: dict[str, Any], indices: list[int]) -> list[dict[str, Any]]:
    """One submit spec per index: its index in the environment, and in the name if any."""
    specs = []
    for index in indices:
        one = dict(spec, env={**(spec.get("env") or {}), ARRAY_INDEX_ENV: str(index)})
        if spec.get("name"):
            one["name"] = f"{spec['name']}[{index}]"
        specs.append(one)
    return specs
