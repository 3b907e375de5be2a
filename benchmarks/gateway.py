"""The agent's gateway: what a proxied request and a WebSocket round trip cost.

A local-process session job runs tests/agent/gateway_upstream.py; the same requests go
to it directly and through the gateway (ticket checked each time), in one run, and the
p50/p95 of each are printed side by side with the overhead (issue 27's goal: < 5 ms
added at p95).

    python -m benchmarks.gateway [--requests 500] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from agent.gateway import Gateway, GatewayServer
from agent.runtime import JobSpec, local
from agent.runtime.local import LocalProcessRuntime
from protocol import tickets
from protocol.signing import key_from_token, token_kid

NODE, TOKEN, JOB = "bench01", "lpn_benchgateway00000000000000", 7
UPSTREAM = Path(__file__).resolve().parents[1] / "tests" / "agent" / "gateway_upstream.py"


def _spec() -> JobSpec:
    return JobSpec.from_wire(
        {
            "job_id": JOB,
            "image": "none",
            "command": [sys.executable, str(UPSTREAM)],
            "uid": 1000,
            "gid": 1000,
            "username": "bench",
            "cpus": 1,
            "memory_mb": 256,
            "pids_limit": 64,
            "session": {"kind": "jupyter"},
        }
    )


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def _measure(direct: str, via: str, n: int) -> dict[str, Any]:
    keys = {token_kid(TOKEN): key_from_token(TOKEN)}

    def ticket() -> dict[str, str]:
        return {
            tickets.HEADER: tickets.issue(
                keys, node=NODE, job_id=JOB, attempt=0, purpose="http", user="bench"
            )
        }

    results: dict[str, Any] = {}
    async with aiohttp.ClientSession() as client:
        deadline = time.monotonic() + 30
        while True:
            try:
                async with client.get(f"{direct}/sessions/{JOB}/echo/x") as r:
                    if r.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the upstream did not start")
            await asyncio.sleep(0.1)
        for name, base, headers in (("direct", direct, {}), ("gateway", via, ticket())):
            http: list[float] = []
            for _ in range(n):
                t0 = time.perf_counter()
                async with client.get(f"{base}/sessions/{JOB}/echo/x", headers=headers) as r:
                    await r.read()
                http.append(time.perf_counter() - t0)
            ws_rtt: list[float] = []
            async with client.ws_connect(f"{base}/sessions/{JOB}/ws", headers=headers) as ws:
                for _ in range(n):
                    t0 = time.perf_counter()
                    await ws.send_str("ping")
                    await ws.receive()
                    ws_rtt.append(time.perf_counter() - t0)
            results[name] = {
                "http_p50_ms": _pct(http, 0.5),
                "http_p95_ms": _pct(http, 0.95),
                "ws_p50_ms": _pct(ws_rtt, 0.5),
                "ws_p95_ms": _pct(ws_rtt, 0.95),
                "http_mean_ms": statistics.fmean(http) * 1000,
            }
    return results


class _NotRoot:
    """``os`` as a non-root agent sees it: as root the runtime would drop the job to the
    spec's uid, which cannot reach this interpreter under /root."""

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    @staticmethod
    def geteuid() -> int:
        return 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    local.os = _NotRoot()  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as state:
        runtime = LocalProcessRuntime(Path(state), enabled=True)
        server = GatewayServer(Gateway(node=NODE, token=TOKEN, runtime=runtime), "127.0.0.1", 0)
        server.start()
        try:
            runtime.start(_spec())
            upstream = runtime.session_upstream(JOB)
            assert upstream is not None
            via = f"{server.url}/jobs/{JOB}/proxy"
            results = asyncio.run(_measure(upstream, via, args.requests))
        finally:
            server.stop()
            runtime.close()
    for key in ("http_p50_ms", "http_p95_ms", "ws_p50_ms", "ws_p95_ms"):
        results.setdefault("added", {})[key] = results["gateway"][key] - results["direct"][key]
    if args.json:
        print(json.dumps({"benchmark": "gateway", "requests": args.requests, **results}))
        return 0
    print(f"gateway proxy overhead, {args.requests} requests each (local-process upstream)")
    print(f"{'':24}{'direct':>10}{'gateway':>10}{'added':>10}")
    for label, key in (
        ("HTTP GET p50 (ms)", "http_p50_ms"),
        ("HTTP GET p95 (ms)", "http_p95_ms"),
        ("WebSocket RTT p50 (ms)", "ws_p50_ms"),
        ("WebSocket RTT p95 (ms)", "ws_p95_ms"),
    ):
        d, g, a = results["direct"][key], results["gateway"][key], results["added"][key]
        print(f"{label:24}{d:10.2f}{g:10.2f}{a:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
