"""What a submit's runtime prediction costs against the command's length and the
owner's history, before and after the shape was cached on the job row.

The baseline is the previous code, measured in the same run: it reshaped each of the
owner's last ``history`` commands with the backtracking pattern
``(?:[\\w.-]*/)+[\\w.-]*``. Today a submit shapes its own command once, with the linear
patterns of ``scheduler.predict``, and matches history by the stored key.

    python -m benchmarks.scheduler_shape [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable

from scheduler.predict import command_shape_key

_OLD_PATH = re.compile(r"(?:[\w.-]*/)+[\w.-]*")
_OLD_HEX = re.compile(r"\b[0-9a-f]{8,}\b")
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e-?\d+)?")
_SPACE = re.compile(r"\s+")

LENGTHS = (10, 1_000, 8_000)
HISTORIES = (0, 50, 200)


def old_command_shape(command: str) -> str:
    shape = _OLD_PATH.sub("<path>", command.strip().lower())
    shape = _OLD_HEX.sub("<hex>", shape)
    shape = _NUMBER.sub("#", shape)
    return _SPACE.sub(" ", shape)


def long_command(length: int) -> str:
    """A command of one long word, the shape that made the old pattern quadratic."""
    head = "python "
    return head + "a" * max(length - len(head), 0)


def best_of(repeats: int, work: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        work()
        times.append(time.perf_counter() - began)
    return min(times)


def measure(length: int, history: int, repeats: int) -> dict[str, float]:
    command = long_command(length)
    past = [long_command(length)] * history
    stored = {command_shape_key(c) for c in past}

    def old() -> object:
        mine = old_command_shape(command)
        return [old_command_shape(c) == mine for c in past]

    def new() -> object:
        return command_shape_key(command) in stored

    old_s = best_of(repeats, old)
    new_s = best_of(repeats, new)
    return {
        "length": length,
        "history": history,
        "old_ms": old_s * 1000,
        "new_ms": new_s * 1000,
        "speedup": old_s / new_s if new_s else float("inf"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    rows = [measure(n, h, args.repeats) for n in LENGTHS for h in HISTORIES]
    if args.json:
        print(json.dumps({"prediction_shape": rows}, indent=2))
        return 0
    print("Submit-time prediction: shaping the command and matching the history")
    print(
        f"{'command chars':>13} {'history':>8} {'previous code ms':>17} {'now ms':>9} {'ratio':>9}"
    )
    for row in rows:
        print(
            f"{row['length']:>13,} {row['history']:>8} {row['old_ms']:>17.3f} "
            f"{row['new_ms']:>9.3f} {row['speedup']:>8.1f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
