"""The simulated GPU backend: stable identity, deterministic and plausible dynamics."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.gpu import SimulatedBackend, select_backend


def run(backend: SimulatedBackend, start: float, seconds: float, step: float = 5.0) -> list:
    """Sample every ``step`` seconds of simulated time; return the last round."""
    last: list = []
    t = start
    while t <= start + seconds:
        last = backend.sample(t)
        t += step
    return last


def test_it_reports_the_requested_number_of_gpus_with_stable_uuids() -> None:
    first = SimulatedBackend(3, node_name="gpu01").discover()
    again = SimulatedBackend(3, node_name="gpu01", seed=99).discover()
    other = SimulatedBackend(3, node_name="gpu02").discover()

    assert [g.index for g in first] == [0, 1, 2]
    assert [g.uuid for g in first] == [g.uuid for g in again]
    assert not {g.uuid for g in first} & {g.uuid for g in other}
    assert all(g.uuid.startswith("GPU-") and g.kind == "gpu" for g in first)
    assert all(g.parent_uuid is None and g.memory_mb > 0 for g in first)


def test_it_is_deterministic_for_a_seed() -> None:
    def trace(seed: int) -> list:
        backend = SimulatedBackend(2, node_name="n", seed=seed)
        backend.attach_job(7, [backend.discover()[0].uuid], "c7")
        return [backend.sample(1000.0 + 5 * i) for i in range(20)]

    assert trace(1) == trace(1)
    assert trace(1) != trace(2)


def test_an_idle_gpu_stays_cool_and_quiet() -> None:
    (sample,) = run(SimulatedBackend(1), 0.0, 600.0)

    assert sample.util_pct == 0.0
    assert sample.mem_used_mb is not None and sample.mem_used_mb < 100
    assert sample.temp_c is not None and sample.temp_c < 40
    assert sample.power_w is not None and sample.power_w < 80
    assert sample.processes == []


def test_a_running_job_loads_warms_and_powers_its_gpu_and_shows_its_process() -> None:
    backend = SimulatedBackend(2, node_name="n")
    busy_uuid, idle_uuid = (g.uuid for g in backend.discover())
    # Job 1's drawn character is busy (not one of the idle one-in-eight).
    backend.attach_job(1, [busy_uuid], "container-1")

    busy, idle = run(backend, 0.0, 600.0)

    assert busy.gpu_uuid == busy_uuid and idle.gpu_uuid == idle_uuid
    assert busy.util_pct is not None and busy.util_pct > 40
    assert busy.mem_used_mb is not None and busy.mem_used_mb > 10_000
    assert busy.mem_used_mb <= busy.mem_total_mb
    assert busy.temp_c > idle.temp_c + 10
    assert busy.power_w > idle.power_w + 100
    assert busy.sm_clock_mhz > idle.sm_clock_mhz
    assert [(p.job_id, p.container_id) for p in busy.processes] == [(1, "container-1")]
    assert idle.processes == [] and idle.util_pct == 0.0


def test_a_gpu_cools_down_after_its_job_ends() -> None:
    backend = SimulatedBackend(1)
    uuid = backend.discover()[0].uuid
    backend.attach_job(1, [uuid], "c")
    (hot,) = run(backend, 0.0, 600.0)
    backend.detach_job(1)
    (cool,) = run(backend, 605.0, 600.0)

    assert cool.processes == []
    assert cool.util_pct is not None and cool.util_pct < 1
    assert cool.temp_c < hot.temp_c - 10
    assert backend.running_job_ids() == set()


def test_it_ignores_gpus_that_are_not_its_own() -> None:
    backend = SimulatedBackend(1)
    backend.attach_job(1, ["GPU-not-here"], "c")

    assert backend.running_job_ids() == set()


def test_auto_falls_back_to_the_simulation_without_nvml() -> None:
    backend = select_backend("auto", node_name="n", sim_gpus=4)

    # This machine has no NVIDIA driver; a GPU machine would get "nvml".
    assert backend.name in {"simulated", "nvml"}
    if backend.name == "simulated":
        assert len(backend.discover()) == 4


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["attach", "detach", "sample"]),
            st.integers(min_value=1, max_value=6),
            st.floats(min_value=0.0, max_value=120.0),
        ),
        max_size=40,
    )
)
def test_readings_stay_physically_plausible(steps: list[tuple[str, int, float]]) -> None:
    backend = SimulatedBackend(2, node_name="h", seed=3)
    uuids = [g.uuid for g in backend.discover()]
    now = 0.0
    for action, job_id, dt in steps:
        if action == "attach":
            backend.attach_job(job_id, uuids[: 1 + job_id % 2], f"c{job_id}")
        elif action == "detach":
            backend.detach_job(job_id)
        now += dt
        for sample in backend.sample(now):
            # The simulator gives every reading.
            assert sample.util_pct is not None and sample.temp_c is not None
            assert sample.mem_used_mb is not None and sample.mem_total_mb is not None
            assert sample.power_w is not None
            assert 0.0 <= sample.util_pct <= 100.0
            assert 0 <= sample.mem_used_mb <= sample.mem_total_mb
            assert 20.0 <= sample.temp_c <= 95.0
            assert 0.0 < sample.power_w < 500.0
            assert sample.ts == now


def test_a_busy_job_dips_at_its_periodic_evaluation_and_recovers() -> None:
    backend = SimulatedBackend(1, node_name="n")
    uuid = backend.discover()[0].uuid
    backend.attach_job(1, [uuid], "c1")
    job = backend._gpus[0].jobs[1]
    every, length = job.dip_every_s, job.dip_len_s
    assert 900 <= every <= 1800 and 30 <= length <= 90

    readings: dict[float, float] = {}
    t = 0.0
    while t <= 2 * every:
        (sample,) = backend.sample(t)
        assert sample.util_pct is not None
        readings[t] = sample.util_pct
        t += 5.0

    def at(moment: float) -> float:
        return readings[max(k for k in readings if k <= moment)]

    before = at(every - 30)
    during = at(every + length - 5)
    after = at(every + length + 60)
    assert before > 40 and after > 40
    assert during < before / 2  # the evaluation: the GPU mostly waits
