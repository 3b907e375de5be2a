"""The messages between the portal and its node agents, each defined once.

Both sides decode what they receive with these Structs (`protocol.wire.decode`), the
portal's `start_spec` builds a `StartJob`, and docs/agent.md's tables are generated
from them (`protocol.docs`). The limits live here and nowhere else.

A field's `Meta(description=...)` is its note in the docs; its `extra["refused"]`
is the detail a refusal of it carries (see `protocol.wire`): `{key}` is the field's
name and `{value}` what was sent. `extra["refused_type"]` replaces it when the value
has the wrong type, `extra["refused_item"]` when an entry of a list or dict is wrong,
and `extra["text"]` ("free" or "identifier") explains a text field from its value.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, ClassVar, Literal, TypeGuard

from msgspec import Meta, Struct

GPU_BACKENDS = ("nvml", "simulated")
RUNTIMES = ("docker", "local", "none")  # none: a monitor-only agent (Slurm node)
GPU_KINDS = ("gpu", "mig")
JOB_EVENT_KINDS = ("started", "exited", "start_failed")
NETWORK_MODES = ("none", "egress")
SESSION_KINDS = ("jupyter", "terminal")
MAX_GATEWAY_URL_CHARS = 200  # Node.gateway_url
MAX_GPUS_PER_NODE = 1024
MAX_LOG_CHARS = 1_000_000
# The portal's columns are as wide as these (tests/cluster/test_hostile_input.py
# compares them), so a message that passes validation always fits the database.
MAX_EVENT_ID_CHARS = 160  # JobEvent.event_id
MAX_CONTAINER_ID_CHARS = 80  # Job.container_id
MAX_NODE_NAME_CHARS = 63  # Node.name
MAX_GPU_UUID_CHARS = 96  # Gpu.uuid
MAX_HOSTNAME_CHARS = 255
MAX_AGENT_VERSION_CHARS = 32
MAX_GPU_MODEL_CHARS = 120
MAX_GPU_INDEX = 9_999
MAX_MEMORY_MB = 2**31 - 1
MIN_EXIT_CODE, MAX_EXIT_CODE = -(2**31), 2**31 - 1  # Job.exit_code (integer)
MAX_JOB_ID = 2**63 - 1
# Epoch seconds from 2001 to 2100: anything else is a broken clock or a forged message.
MIN_TS, MAX_TS = 1.0e9, 4102444800.0
MAX_JOB_IDS = 10_000
NODE_NAME = re.compile(rf"[-a-zA-Z0-9_]{{1,{MAX_NODE_NAME_CHARS}}}")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# An identifier (a UUID, an event or container id) holds no control character, nor a
# lone surrogate (JSON over the broker can carry one: "\ud800"); it is not blank.
IDENTIFIER = r"^(?=[\s\S]*\S)[^\x00-\x1f\x7f\ud800-\udfff]*$"
NOT_BLANK = r"\S"


def _identifier(max_length: int) -> Meta:
    return Meta(
        min_length=1, max_length=max_length, pattern=IDENTIFIER, extra={"text": "identifier"}
    )


GpuUuid = Annotated[str, _identifier(MAX_GPU_UUID_CHARS)]
EventId = Annotated[str, _identifier(MAX_EVENT_ID_CHARS)]
ContainerId = Annotated[str, _identifier(MAX_CONTAINER_ID_CHARS)]
# Free text: the portal replaces what no database can store (NUL, lone surrogates).
GpuModel = Annotated[
    str, Meta(max_length=MAX_GPU_MODEL_CHARS, pattern=NOT_BLANK, extra={"text": "free"})
]
Hostname = Annotated[str, Meta(max_length=MAX_HOSTNAME_CHARS, extra={"text": "blank_ok"})]
AgentVersion = Annotated[str, Meta(max_length=MAX_AGENT_VERSION_CHARS, extra={"text": "blank_ok"})]


def _one_of(values: tuple[str, ...], got: int = 40) -> dict[str, str]:
    return {"refused": f"{{key}} must be one of {', '.join(values)}, got {{value!r:.{got}}}"}


JobId = Annotated[
    int,
    Meta(
        gt=0,
        le=MAX_JOB_ID,
        description="the portal's job id",
        extra={"refused": "{key} must be a positive integer, got {value!r:.40}"},
    ),
]
_JOB_IDS = Meta(
    max_length=MAX_JOB_IDS,
    extra={
        "refused": f"{{key}} must be a list of at most {MAX_JOB_IDS} job ids",
        "refused_item": "{key} must hold positive integers, got {value!r:.80}",
    },
)
JobIds = Annotated[list[Annotated[int, Meta(gt=0, le=MAX_JOB_ID)]], _JOB_IDS]
LogText = Annotated[
    str,
    Meta(
        description=f"the log's last {MAX_LOG_CHARS} characters are kept",
        extra={"refused": "{key} must be a string"},
    ),
]


class Message(Struct, frozen=True, kw_only=True):
    """A message's refusals: `object_refused` when it is not an object at all, and
    `missing` for an absent required field (None: the field's own refusal, of None)."""

    object_refused: ClassVar[str] = "must be an object, got {type}"
    missing: ClassVar[str | None] = None
    # Fields whose value is null, empty or zero take their default (the agent's spec).
    empty_is_default: ClassVar[bool] = False


# Agent -> portal -----------------------------------------------------------------------


class GpuReport(Message, frozen=True, kw_only=True):
    """One entry of `node_register`'s `gpus`: a whole GPU or a MIG instance."""

    object_refused: ClassVar[str] = "each GPU must be an object"

    uuid: Annotated[GpuUuid, Meta(description="`GPU-…` or `MIG-…`")]
    index: Annotated[
        int,
        Meta(
            ge=0,
            le=MAX_GPU_INDEX,
            description="a MIG instance has its parent's index",
            extra={"refused": "{key} must be a small non-negative integer, got {value!r:.20}"},
        ),
    ]
    model: GpuModel
    memory_mb: Annotated[
        int,
        Meta(
            ge=0,
            le=MAX_MEMORY_MB,
            description="a MIG instance has its own memory size",
            extra={"refused": "{key} must be a non-negative integer, got {value!r:.20}"},
        ),
    ]
    kind: Annotated[
        Literal["gpu", "mig"],
        Meta(extra={"refused": "{key} must be gpu or mig, got {value!r:.20}"}),
    ] = "gpu"
    parent_uuid: (
        Annotated[GpuUuid, Meta(description="a MIG instance's GPU; null for a whole GPU")] | None
    ) = None

    def __post_init__(self) -> None:
        if self.kind == "mig" and self.parent_uuid is None:
            raise ValueError("parent_uuid must be a non-empty string, got None")
        if self.kind == "gpu" and self.parent_uuid is not None:
            raise ValueError("a whole GPU has no parent_uuid")


GPUS = Meta(
    max_length=MAX_GPUS_PER_NODE,
    extra={"refused": f"{{key}} must be a list of at most {MAX_GPUS_PER_NODE} entries"},
)


class NodeInfo(Message, frozen=True, kw_only=True):
    """`control.node_register(node, token, info)`: what the node is and which GPUs it has."""

    object_refused: ClassVar[str] = "info must be an object, got {type}"

    hostname: Hostname | None = None
    agent_version: AgentVersion | None = None
    gpu_backend: Annotated[
        Literal["nvml", "simulated"],
        Meta(description="`simulated`: the portal shows it", extra=_one_of(GPU_BACKENDS)),
    ]
    runtime: Annotated[
        Literal["docker", "local", "none"],
        Meta(description="`none`: a monitor-only agent (a Slurm node)", extra=_one_of(RUNTIMES)),
    ]
    gpus: Annotated[
        list[GpuReport],
        GPUS,
        Meta(description="a malformed entry is set aside, the others register"),
    ]
    gateway: (
        Annotated[
            str,
            Meta(
                max_length=MAX_GATEWAY_URL_CHARS,
                pattern=r"^https?://[^\s/?#]+/?$",
                description="the base URL at which the portal reaches this node's gateway "
                "(`--gateway-url`, else `http://` + `--gateway-listen`); null: no gateway, so "
                "no sessions or terminals on this node",
                extra={"refused": "{key} must be an http(s) base URL, got {value!r:.80}"},
            ),
        ]
        | None
    ) = None


class Heartbeat(Message, frozen=True, kw_only=True):
    """`control.node_heartbeat(node, token, info)`: the node is alive, and runs these jobs."""

    object_refused: ClassVar[str] = "info must be an object, got {type}"

    ts: Annotated[
        Any, Meta(description="epoch seconds (not checked)", extra={"doc_type": "float"})
    ] = None
    running_job_ids: (
        Annotated[
            JobIds,
            Meta(description="the jobs whose containers run here; null: nothing is reconciled"),
        ]
        | None
    ) = None
    starting_job_ids: (
        Annotated[JobIds, Meta(description="the jobs inside `start_job` now (pulling, creating)")]
        | None
    ) = None
    monitor_only: Annotated[
        Any,
        Meta(
            description="`true` from a monitor-only agent (not checked)", extra={"doc_type": "bool"}
        ),
    ] = None


class JobLogsReport(Message, frozen=True, kw_only=True):
    """`control.job_logs_report(node, token, job_id, text)`: a job's log tail, on request."""

    job_id: JobId
    text: LogText


class JobEvent(Message, frozen=True, kw_only=True):
    """`control.job_event(node, token, event)`: a job started, exited, or could not start."""

    object_refused: ClassVar[str] = "event must be an object, got {type}"

    event_id: Annotated[EventId, Meta(description="the portal deduplicates on it")]
    job_id: JobId
    kind: Annotated[
        Literal["started", "exited", "start_failed"], Meta(extra=_one_of(JOB_EVENT_KINDS))
    ]
    ts: (
        Annotated[
            float,
            Meta(
                ge=MIN_TS,
                le=MAX_TS,
                description="epoch seconds",
                extra={
                    "refused": f"{{key}} must be null or epoch seconds from {MIN_TS:.0f} "
                    f"to {MAX_TS:.0f}, got {{value!r:.40}}"
                },
            ),
        ]
        | None
    ) = None
    container_id: ContainerId | None = None
    exit_code: (
        Annotated[
            int,
            Meta(
                ge=MIN_EXIT_CODE,
                le=MAX_EXIT_CODE,
                description="the shell convention: 128+N means killed by signal N "
                "(137 SIGKILL, 143 SIGTERM)",
                extra={
                    "refused": f"{{key}} must be null or an integer from {MIN_EXIT_CODE} to "
                    f"{MAX_EXIT_CODE}, got {{value!r:.40}}"
                },
            ),
        ]
        | None
    ) = None
    log_tail: (
        Annotated[
            str,
            Meta(
                description=f"the portal keeps the last {MAX_LOG_CHARS} characters",
                extra={"refused": "{key} must be a string or null"},
            ),
        ]
        | None
    ) = None
    reason: (
        Annotated[
            str,
            Meta(
                description="empty, `stopped: …`, an out-of-memory message, "
                "or `found ended when the agent started`",
                extra={"refused": "{key} must be a string or null"},
            ),
        ]
        | None
    ) = None


MAX_SAMPLES_PER_BATCH = 10_000
MAX_PROCESSES_PER_SAMPLE = 1_024
MAX_PROCESS_CONTAINER_ID_CHARS = 128
MAX_UNIX_USER_CHARS = 64
MAX_PID = 2**31 - 1


def _metric(low: int, high: int, kind: str, description: str = "") -> Meta:
    return Meta(
        ge=low,
        le=high,
        description=description,
        extra={
            "refused": f"{{key}} must be null or {kind} from {low} to {high}, got {{value!r:.40}}"
        },
    )


def _of_a_process(what: str) -> Meta:
    return Meta(extra={"refused": f"a process's {{key}} must be null or {what}"})


class SampleProcess(Message, frozen=True, kw_only=True):
    """One entry of a sample's `processes`: a process on the GPU."""

    object_refused: ClassVar[str] = "each process needs a pid, a non-negative 32-bit integer"

    pid: Annotated[
        int,
        Meta(
            ge=0,
            le=MAX_PID,
            extra={"refused": "each process needs a pid, a non-negative 32-bit integer"},
        ),
    ]
    used_mb: (
        Annotated[int, Meta(ge=0, le=MAX_MEMORY_MB), _of_a_process("a non-negative integer")] | None
    ) = None
    container_id: Annotated[str, _identifier(MAX_PROCESS_CONTAINER_ID_CHARS)] | None = None
    job_id: (
        Annotated[
            int,
            Meta(
                gt=0, le=MAX_JOB_ID, description="null: the process belongs to no job on this node"
            ),
            _of_a_process("a positive integer"),
        ]
        | None
    ) = None
    unix_user: (
        Annotated[
            str,
            Meta(max_length=MAX_UNIX_USER_CHARS, description="sent for a process of no job"),
            _of_a_process("a user name"),
        ]
        | None
    ) = None
    slurm_job_id: (
        Annotated[
            int,
            Meta(gt=0, le=MAX_JOB_ID, description="a monitor-only (Slurm) node's job id for it"),
            _of_a_process("a positive integer"),
        ]
        | None
    ) = None


class Sample(Message, frozen=True, kw_only=True):
    """One entry of `control.samples_ingest(node, token, samples)`: a GPU's readings.

    Any reading is null when the hardware does not report it (a MIG instance has no
    utilisation and no temperature)."""

    object_refused: ClassVar[str] = "must be an object, got {type}"

    gpu_uuid: GpuUuid
    ts: Annotated[
        float,
        Meta(
            gt=0,
            description="epoch seconds; the portal refuses a sample from the future or too old",
            extra={"refused": "{key} must be epoch seconds, got {value!r:.40}"},
        ),
    ]
    util_pct: Annotated[float, _metric(0, 100, "a number")] | None = None
    mem_used_mb: Annotated[int, _metric(0, MAX_MEMORY_MB, "an integer")] | None = None
    mem_total_mb: Annotated[int, _metric(0, MAX_MEMORY_MB, "an integer")] | None = None
    temp_c: Annotated[float, _metric(-50, 200, "a number")] | None = None
    power_w: Annotated[float, _metric(0, 10_000, "a number")] | None = None
    sm_clock_mhz: Annotated[int, _metric(0, 100_000, "an integer")] | None = None
    ecc_errors: (
        Annotated[
            int,
            _metric(
                0,
                MAX_JOB_ID,
                "an integer",
                "the volatile count of uncorrected ECC errors since the driver loaded",
            ),
        ]
        | None
    ) = None
    xid_errors: (
        Annotated[
            int,
            _metric(
                0, MAX_JOB_ID, "an integer", "the XID critical errors seen since the agent started"
            ),
        ]
        | None
    ) = None
    processes: (
        Annotated[
            list[SampleProcess],
            Meta(
                max_length=MAX_PROCESSES_PER_SAMPLE,
                extra={"refused": f"{{key}} must be a list of at most {MAX_PROCESSES_PER_SAMPLE}"},
            ),
        ]
        | None
    ) = None

    def __post_init__(self) -> None:
        if not math.isfinite(self.ts):
            raise ValueError(f"ts must be epoch seconds, got {self.ts!r:.40}")


METRICS = tuple(
    name for name in Sample.__struct_fields__ if name not in ("gpu_uuid", "ts", "processes")
)


# Portal -> agent -----------------------------------------------------------------------


class Mount(Message, frozen=True, kw_only=True):
    """One entry of `StartJob.mounts`, already resolved for the member."""

    object_refused: ClassVar[str] = "each mount must be an object with source, target, read_only"

    source: Annotated[
        str,
        Meta(
            min_length=1,
            description="an absolute path; the agent refuses one outside its "
            "`--allowed-mount-root` directories, or through a symlink below one",
            extra={"refused": "mount {key} must be a non-empty string"},
        ),
    ]
    target: Annotated[
        str,
        Meta(
            min_length=1,
            description="an absolute path in the container",
            extra={"refused": "mount {key} must be a non-empty string"},
        ),
    ]
    read_only: Annotated[
        bool, Meta(extra={"refused": "mount {parent[source]!r}: 'read_only' must be true or false"})
    ] = True


class SessionSpec(Message, frozen=True, kw_only=True):
    """`StartJob.session`: the job is an interactive session that the gateway reaches."""

    object_refused: ClassVar[str] = "'session' must be an object with kind and port"

    kind: Annotated[
        Literal["jupyter", "terminal"],
        Meta(
            description="`jupyter`: a server the gateway proxies; `terminal`: the job "
            "keeps running and the terminal is an exec",
            extra={"refused": f"session kind must be one of {', '.join(SESSION_KINDS)}"},
        ),
    ]
    port: Annotated[
        int,
        Meta(
            ge=1,
            le=65535,
            description="where the server listens inside a Docker container (the local "
            "runtime picks a free port instead); the job reads it from "
            "`LABPORTAL_SESSION_PORT`",
            extra={"refused": "session port must be an integer from 1 to 65535"},
        ),
    ] = 8888


_POSITIVE = "'cpus', 'memory_mb' and 'pids_limit' must be positive"


class StartJob(Message, frozen=True, kw_only=True):
    """`agent.start_job(spec)`: everything the agent needs to start a job, nothing to look up."""

    object_refused: ClassVar[str] = "the job spec must be an object"
    missing: ClassVar[str | None] = "the job spec has no {key!r}"
    empty_is_default: ClassVar[bool] = True

    job_id: Annotated[int, Meta(extra={"refused": "'job_id' must be an integer"})]
    image: Annotated[
        str,
        Meta(
            pattern=NOT_BLANK,
            description="must already be on the node's allowlist (the portal checks this); "
            "pulled if missing",
            extra={"refused": "'image' is empty", "refused_type": "'image' must be a string"},
        ),
    ]
    command: Annotated[
        list[str],
        Meta(
            description="`[]` means the image's default (Docker only)",
            extra={
                "refused": "'command' must be a list",
                "refused_item": "'command' must be a list of strings",
            },
        ),
    ]
    env: Annotated[
        dict[str, str],
        Meta(
            description="names must be valid shell identifiers",
            extra={"refused": "'env' must map strings to strings"},
        ),
    ] = {}
    gpu_uuids: Annotated[
        list[Annotated[str, Meta(min_length=1)]],
        Meta(
            description="`GPU-…` or `MIG-…` UUIDs, as registered, or a shared slot "
            "`<GPU uuid>::slot<n>`; each (a slot's GPU) must be on this node. A slot job "
            "runs on its GPU: the container sees the parent GPU",
            extra={"refused": "'gpu_uuids' must be a list of GPU UUID strings"},
        ),
    ] = []
    gpu_indices: Annotated[
        list[int],
        Meta(
            description="informational; the agent uses the UUIDs",
            extra={"refused": "'gpu_indices' must be a list of integers"},
        ),
    ] = []
    uid: Annotated[
        int,
        Meta(
            description="the member's own id; **0 is refused** (jobs never run as root)",
            extra={"refused": "'uid' must be an integer"},
        ),
    ]
    gid: Annotated[
        int,
        Meta(
            description="the member's own group id; **0 is refused**",
            extra={"refused": "'gid' must be an integer"},
        ),
    ]
    username: Annotated[
        str,
        Meta(
            description="goes in the `labportal.user` label",
            extra={"refused": "'username' must be a string"},
        ),
    ]
    cpus: Annotated[
        float,
        Meta(
            gt=0,
            extra={"refused": _POSITIVE, "refused_type": "'cpus' must be an integer or a number"},
        ),
    ]
    memory_mb: Annotated[
        int,
        Meta(
            gt=0,
            description="memory and memory+swap limit",
            extra={"refused": _POSITIVE, "refused_type": "'memory_mb' must be an integer"},
        ),
    ]
    pids_limit: Annotated[
        int,
        Meta(
            gt=0,
            extra={"refused": _POSITIVE, "refused_type": "'pids_limit' must be an integer"},
        ),
    ]
    mounts: Annotated[
        list[Mount],
        Meta(
            description="already resolved per user (`/data/{username}` → `/data/alice`); "
            "`read_only` defaults to true",
            extra={"refused": "'mounts' must be a list"},
        ),
    ] = []
    time_limit_s: Annotated[
        int,
        Meta(
            description="recorded; the portal enforces limits by sending `stop_job` "
            "(warn, don't kill)",
            extra={"refused": "'time_limit_s' must be an integer"},
        ),
    ] = 0
    attempt: Annotated[
        int,
        Meta(
            ge=0,
            description="counts the portal's dispatches of the job: an ended container of an "
            "earlier attempt is not this one's",
            extra={"refused": "'attempt' must be a non-negative integer"},
        ),
    ] = 0
    network: Annotated[
        Literal["none", "egress"],
        Meta(
            description="`none` (default): no network at all; `egress`: a network of the "
            "job's own with a route out, only for queues whose admin allowed it",
            extra={"refused": f"'network' must be one of {', '.join(NETWORK_MODES)}"},
        ),
    ] = "none"
    session: (
        Annotated[
            SessionSpec,
            Meta(
                description="an interactive session (see *Gateway*); null: a batch job. With "
                "Docker its container joins the internal network `labportal-sessions` (no "
                "route out), and its own egress network too if `network` is `egress`",
            ),
        ]
        | None
    ) = None

    def __post_init__(self) -> None:
        # Root in the container owns files on the member's volumes as root and is one
        # kernel bug away from root on the host: never run a job as root.
        if self.uid <= 0 or self.gid <= 0:
            raise ValueError(
                f"refusing to run job {self.job_id} as uid {self.uid} gid {self.gid}: jobs "
                "must run as the member's own non-root uid and gid"
            )
        for name in self.env:
            if not ENV_NAME.match(name):
                raise ValueError(f"environment variable name {name!r} is not valid")


def node_name_valid(value: object) -> TypeGuard[str]:
    """A node name as the portal stores it: letters, digits, - and _, at most 63."""
    return isinstance(value, str) and NODE_NAME.fullmatch(value) is not None
