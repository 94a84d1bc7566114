"""Settings: one pydantic-settings model, defaults that make the embedded default work with no file.

`load_settings()` reads, highest precedence first: init kwargs (only `home`, which is always
`nightshift_home()`), the environment `NIGHTSHIFT_<SECTION>__<KEY>` (pydantic-settings'
`env_prefix="NIGHTSHIFT_"`, `env_nested_delimiter="__"`), the model endpoint's standard variables
`OPENAI_BASE_URL`, `OPENAI_API_KEY` and `NIGHTSHIFT_MODEL` (the `llm` section),
`$NIGHTSHIFT_HOME/config.yaml` (or an explicit path; pydantic-settings' YAML source) and the
built-in defaults. It also says where each
effective value came from, and turns every problem into one `ConfigError` naming the field and
its source.

Environment values are strings that pydantic coerces in lax mode (`0.2` to a float, `2` to an
int); a list, mapping or section (`NIGHTSHIFT_TARIFF__WINDOWS`, `NIGHTSHIFT_RETRY`) is JSON, and
`null` is None. Other `NIGHTSHIFT_*` variables (the attempt markers the executors set for child
processes, the example's fault switches) are not settings and are ignored, as are unknown keys.

A `Settings(...)` built in code reads neither the environment nor a file: it is exactly its
arguments over the defaults, so a test or an eval that builds one is not changed by the shell
it runs in.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    YamlConfigSettingsSource,
)

from nightshift.runtime.errors import ConfigError
from nightshift.runtime.read_settings import home_from, nightshift_home
from nightshift.runtime.scheduling.backoff import Backoff
from nightshift.runtime.scheduling.tariff import Tariff

ENV_PREFIX = "NIGHTSHIFT_"
ENV_DELIMITER = "__"


class StoreSettings(BaseModel):
    url: str | None = Field(
        None, description="SQLAlchemy URL; default sqlite:///$NIGHTSHIFT_HOME/nightshift.db"
    )
    busy_timeout_s: float = Field(
        30.0, gt=0, description="How long a write waits for another process's lock"
    )


class AuditSettings(BaseModel):
    """How far the audit anchor may trail the log (policies/audit.py: group commit), the key that
    signs the events and where the chain head is published."""

    anchor_every_events: int = Field(
        1000, ge=1, description="Rewrite the anchor after this many events"
    )
    anchor_lag_s: float = Field(
        0.2, ge=0, description="…or this long after an event; 0: every event"
    )
    key_file: str | None = Field(
        None,
        description="HMAC key that signs every event (created 0600 on first use); "
        "default $NIGHTSHIFT_HOME/keys/audit.key",
    )
    publish_file: str | None = Field(
        None,
        description="Append the chain head here as JSON lines; keep it where the store's owner "
        "cannot rewrite it (another host, a mounted share); verify checks against it",
    )
    publish_syslog: bool = Field(False, description="Also log the chain head to syslog/journald")
    publish_every_s: float = Field(
        60.0, gt=0, description="Publish the head at most this often while events are appended"
    )


class PvcMount(BaseModel):
    """A PersistentVolumeClaim every Kubernetes pod mounts (code, data, checkpoints)."""

    claim: str = Field(description="The PVC's name, in the executor's namespace")
    mount_path: str = Field(description="Where the pod sees it; give the same path as the host")
    sub_path: str | None = None
    read_only: bool = False


class KubernetesSettings(BaseModel):
    """Where and how a `batch/v1` Job per attempt is created (runtime/executors/kubernetes_executor.py)."""

    namespace: str = "default"
    api_url: str | None = Field(
        None,
        description="The API server's URL; None: the kubeconfig (or in-cluster config) decides",
    )
    kubeconfig: str | None = Field(None, description="A kubeconfig file; default ~/.kube/config")
    context: str | None = Field(None, description="The kubeconfig context to use")
    mounts: list[PvcMount] = Field(default_factory=list)
    priority_classes: dict[int, str] = Field(
        default_factory=dict,
        description="Job priority (at least this) → PriorityClass name, e.g. {0: batch, 5: urgent}",
    )
    kueue_queue: str | None = Field(
        None, description="Kueue LocalQueue (the kueue.x-k8s.io/queue-name label); None: no Kueue"
    )
    service_account: str | None = None
    image: str | None = Field(
        None, description="The image of a job whose spec names none (a pod always needs one)"
    )


class ExecutorSettings(BaseModel):
    kind: Literal["local", "docker", "ray", "kubernetes"] = Field(
        "local",
        description="local processes; Docker containers for specs that name an image; jobs "
        "of an existing Ray cluster (its Jobs API); a Kubernetes Job per attempt",
    )
    ray_address: str = Field(
        "http://127.0.0.1:8265", description="The Ray dashboard's address (the Jobs API)"
    )
    kubernetes: KubernetesSettings = KubernetesSettings()
    runs_dir: str | None = Field(
        None, description="Where attempt logs go; default $NIGHTSHIFT_HOME/runs"
    )
    run_as: Literal["auto", "submitter", "daemon"] = Field(
        "auto",
        description="Whose account a job's program runs as. submitter: its submitter's (the "
        "daemon starts as root to switch to it; README Shared install); daemon: the daemon's "
        "own, with all its rights; auto: submitter when the daemon serves other users "
        "(its socket outside its home, connectable by others), else daemon",
    )
    cgroups: Literal["auto", "required", "off"] = Field(
        "auto",
        description="A local run in a cgroup of its own (resources.host_memory_gb, cpus as "
        "kernel limits; every process of the run found). auto: where the daemon can make one "
        "(root), required where jobs run as their submitters; required: a run that cannot "
        "have one does not start; off: none",
    )
    stop_grace_s: float = 10.0
    docker_url: str | None = Field(None, description="Docker engine socket; default $DOCKER_HOST")
    network_mode: str = Field("none", description="Container network unless the spec names one")
    pids_limit: int | None = Field(4096, description="Max processes per container")


class GpuSettings(BaseModel):
    probe: Literal["auto", "nvml", "nvidia-smi", "inventory", "none"] = "auto"
    inventory: str | None = Field(
        None, description="Declared inventory file (YAML) for the inventory probe"
    )
    nvidia_smi: str = Field(
        "nvidia-smi", description="nvidia-smi's name or path (on every node, for a Ray cluster)"
    )
    cluster_census_timeout_s: float = Field(
        15.0,
        gt=0,
        le=600,
        description="With executor.kind: ray, how long each nvidia-smi command on a node may take",
    )


class PowerSettings(BaseModel):
    """The daemon's power cap at peak price: while the tariff is at its highest price, each GPU
    of this machine running a cost_sensitive job gets a lower power limit (through the
    set_power_limit skill, as the scheduler), and its recorded limit back once the price drops
    or the job ends. The policy decides whether the scheduler may do it without a person
    (policies/default.yaml, waiver scheduler-caps-gpu-power-at-peak)."""

    cap_at_peak: bool = Field(
        False,
        description="Cap the GPUs of cost_sensitive jobs while the tariff is at its peak price "
        "(off: the daemon never changes a power limit, and puts back any it changed)",
    )
    cap_watts: float | None = Field(
        None,
        gt=0,
        description="The cap in watts, clamped into each card's own min-max limits; default: "
        "the card type's least-energy-per-work limit from the power model, else cap_fraction",
    )
    cap_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="The cap as a fraction of each card's default limit (0.7: 70 %), clamped "
        "into its min-max limits; used where cap_watts is unset and the power model does not "
        "know the card (then 0.7), or always when set",
    )

    @model_validator(mode="after")
    def _one_cap(self) -> PowerSettings:
        if self.cap_watts is not None and self.cap_fraction is not None:
            raise ValueError(
                "give cap_watts or cap_fraction, not both (cap_watts is in watts for every "
                "card; cap_fraction scales with each card's default limit)"
            )
        return self


class HealthThresholds(BaseModel):
    """Thresholds for the GPU verdict; each reason in a verdict names the one it crossed."""

    temp_warning_c: float = 83.0
    temp_critical_c: float = 90.0
    memory_used_warning_frac: float = 0.95
    power_warning_frac: float = 0.98
    ecc_uncorrected_critical: int = 1
    retired_pages_warning: int = 1
    recover_after_checks: int = Field(
        3,
        ge=1,
        description="A quarantined GPU (latest verdict CRITICAL or UNKNOWN) returns to placement "
        "after this many consecutive healthy checks, not on the first OK",
    )
    dcgm_diag: Literal["auto", "off"] = Field(
        "auto",
        description="auto: where NVIDIA DCGM's dcgmi is on PATH, a quarantined GPU of this "
        "machine returns only when `dcgmi diag -r 1 -i INDEX` also passes, run at the "
        "recover_after_checks-th healthy check (a failure starts the count again); off: the "
        "healthy checks alone",
    )
    dcgm_diag_timeout_s: float = Field(
        120.0, gt=0, le=1800, description="How long one `dcgmi diag -r 1` may take"
    )


class PolicySettings(BaseModel):
    file: str | None = Field(
        None, description="Policy YAML; default: the shipped policies/default.yaml"
    )
    # Not a setting: who asks comes from the kernel (agent/brain/wiring.py, agent/doors/api_server.py). The
    # field stays only so that `load_settings` can refuse it from a file or the environment with
    # the fix, instead of a bare "extra field"; nothing reads it.
    principal: str | None = Field(
        None,
        description="Refused: who you are is your OS user (or your uid on the daemon's socket)",
    )


class ApiSettings(BaseModel):
    """The daemon's API on a Unix socket (agent/doors/api_server.py), and when the CLI is its client
    (agent/doors/remote.py): who asks is the peer's uid from the kernel, never a name it sends."""

    socket: str | None = Field(
        None,
        description="The socket the daemon serves and clients connect to; default "
        "$NIGHTSHIFT_HOME/api.sock. A shared install puts it outside the daemon's 0700 home, "
        "e.g. /run/nightshift/api.sock, and points clients at it",
    )
    socket_mode: str = Field(
        "0666",
        description="Permissions of the socket, octal: who may connect (0660 with socket_group: "
        "that group only); what each may do is the policy's, by the uid the kernel reports",
    )
    socket_group: str | None = Field(
        None, description="Group given the socket; default: the daemon's"
    )
    mode: Literal["auto", "client", "embedded"] = Field(
        "auto",
        description="auto: a client of the daemon when the socket (or its folder) belongs to "
        "another user, else embedded; client: always through the socket; embedded: never",
    )
    serve: bool = Field(True, description="Whether `nightshift daemon` serves the API")
    max_request_bytes: int = Field(1 << 20, ge=1024, description="Longest request line")
    idle_timeout_s: float = Field(
        30.0, gt=0, description="A connection that sends no whole request for this long is closed"
    )
    confirm_timeout_s: float = Field(
        300.0, gt=0, description="How long the daemon waits for a requester's y/N (then: no)"
    )
    max_connections_per_user: int = Field(16, ge=1, description="Open connections per uid")
    requests_per_s: float = Field(
        20.0,
        gt=0,
        description="Requests a second each uid may send, beyond its burst; past it a request "
        "is refused with the time to retry",
    )
    burst: int = Field(100, ge=1, description="Requests a uid may send at once before the rate")
    refusals_in_full_per_minute: int = Field(
        10,
        ge=0,
        description="Refused requests audited one by one (api.refused) per uid and minute; the "
        "rest are counted into one api.refused_aggregate event for that minute",
    )

    @field_validator("socket_mode", mode="before")
    @classmethod
    def _octal(cls, v: Any) -> Any:
        # YAML 1.1 reads `0660` as the integer 432; the environment gives the string "0660".
        if isinstance(v, int) and not isinstance(v, bool):
            v = f"{v:04o}"
        if isinstance(v, str):
            try:
                bits = int(v.strip(), 8)
            except ValueError:
                raise ValueError(f"{v!r} is not an octal mode such as 0666 or 0660") from None
            if not 0 <= bits <= 0o777:
                raise ValueError(f"{v!r} is not a permission mode (0000 to 0777)")
            return f"{bits:04o}"
        return v

    @property
    def socket_mode_bits(self) -> int:
        return int(self.socket_mode, 8)


class LoopSettings(BaseModel):
    poll_interval_s: float = 0.5
    node: str | None = Field(
        None,
        description="This daemon's name among the daemons sharing one store (default: the host "
        "name): it starts any queued job, and watches, recovers and places on its own GPUs only "
        "the attempts it started",
    )
    cpu_slots: int = Field(1, ge=1, description="CPU-only jobs that may run at once")
    provenance_budget_s: float = Field(
        10.0,
        ge=0,
        le=600,
        description="At most this long reading an attempt's provenance (git, package list, "
        "image digest, data fingerprints) before it launches; what is left unread is noted; "
        "0 records only what needs no command (argv, seed, env, GPUs, host)",
    )
    health_interval_min: float = Field(
        10.0, gt=0, description="The daemon checks GPU health this often"
    )
    lease_heartbeat_s: float = Field(
        5.0,
        gt=0,
        description="On a SQLite store, the daemon renews its lease on the store (one daemon "
        "per store, from any home) this often",
    )
    lease_timeout_s: float = Field(
        60.0,
        gt=0,
        description="On a SQLite store, a lease not renewed for this long is stale: its daemon "
        "is taken for dead and another may serve the store (at once on the same node when its "
        "process is gone); at least twice lease_heartbeat_s",
    )

    @model_validator(mode="after")
    def _lease_outlives_heartbeats(self) -> LoopSettings:
        if self.lease_timeout_s < 2 * self.lease_heartbeat_s:
            raise ValueError(
                f"lease_timeout_s ({self.lease_timeout_s:g}) must be at least twice "
                f"lease_heartbeat_s ({self.lease_heartbeat_s:g}): else a live daemon's lease "
                "goes stale between two heartbeats"
            )
        return self


class StallSettings(BaseModel):
    """The stall rule for a spec without `stall_min`: a hung run is stopped (and recovered)
    instead of holding its slot until `timeout_min`, judged against its own pace."""

    multiple: float = Field(
        10.0,
        ge=1,
        description="A run with no progress for this many times its own step interval (the "
        "median time between its recent metric reports) is stalled",
    )
    floor_min: float = Field(
        15.0,
        gt=0,
        description="Never stalled by this rule before this many minutes without progress, "
        "however fast it reported: slow evaluations and checkpoints are not hangs",
    )
    min_reports: int = Field(
        2,
        ge=2,
        description="Judged only once the monitor has seen new metric steps at this many of its "
        "reads (two give one interval); a program that never reports steps is left to "
        "timeout_min (`validate` says so)",
    )


class SchedulerSettings(BaseModel):
    """How placement weighs and holds queued work (see runtime/scheduling/placement.py)."""

    aging_per_hour: float = Field(
        0.0,
        ge=0,
        description="Priority points a waiting job gains per hour (with order srpt a point is "
        "a doubling: the starvation guard `promote_after_h` bounds the wait instead)",
    )
    preempt_margin: int | None = Field(
        1,
        ge=1,
        description="Pause a running pausable job (one whose spec checkpoints) for a waiting "
        "one this many points more urgent: with order srpt, one point is one doubling, so 1 "
        "pauses a job for one needing at most half its remaining GPU time; None: never preempt",
    )
    preempt_max_per_call: int = Field(4, ge=1)
    preempt_min_left_min: float = Field(
        30.0,
        ge=0,
        description="Never pause (preempt or move) a running job expected to end within this "
        "many minutes: its GPUs free up soon anyway, and a pause redoes its work since its "
        "checkpoint (measured in docs/benchmarks.md); 0: any job may be paused",
    )
    preempt_wider: bool = Field(
        True,
        description="A waiting job may pause a running one on more GPUs than it asks for; off: "
        "never (a pause redoes work on every GPU the victim held: less energy, more delay)",
    )
    default_duration_min: float = Field(
        60.0, gt=0, description="For jobs with no expectation or history"
    )
    cost_threshold_per_kwh: float | None = Field(
        None,
        ge=0,
        description="cost_sensitive jobs start at or below this price; None: `cost_band`",
    )
    cost_band: Literal["cheapest", "not_peak"] = Field(
        "cheapest",
        description="When no price is set: cost_sensitive jobs run at the tariff's cheapest "
        "price, or (not_peak) at any price below its highest",
    )
    hold_slack_min: float = Field(
        60.0,
        ge=0,
        description="A cost_sensitive job with a deadline is held for cheap hours only if it "
        "could still start this long before the last moment that meets the deadline",
    )
    hold_min_gpu_h: float = Field(
        0.0,
        ge=0,
        description="Hold for cheap hours only cost_sensitive jobs expected to use at least "
        "this many GPU-hours; smaller ones start at once",
    )
    hold_max_wait_h: float | None = Field(
        None,
        ge=0,
        description="Hold or pause a cost_sensitive job for cheap hours only while its wait in "
        "all (queued, held or paused since submission) stays within this many hours; unset: "
        "its deadline alone bounds the wait (a long job with days of slack may run over "
        "several nights)",
    )
    order: Literal["priority", "sjf_aging", "las", "srpt"] = Field(
        "srpt",
        description="Queue order: priority (aged priority), sjf_aging (also shortest estimate "
        "first, a point off per doubling), las (least attained GPU time, Tiresias), srpt "
        "(fewest estimated GPU-seconds left first, a point off per doubling, running jobs "
        "too); measured in docs/benchmarks.md",
    )
    promote_after_h: float | None = Field(
        24.0,
        gt=0,
        description="The starvation guard: a job that has waited this many hours in all goes "
        "ahead of every job that has not (oldest first) and, once running, is not preempted; "
        "None: aging alone bounds the wait",
    )
    host_fit: Literal["first", "best"] = Field(
        "best",
        description="Host for a job: the first that fits, or the best fit (fewest GPUs left), "
        "keeping whole hosts for wide jobs",
    )
    migrate_after_min: float | None = Field(
        30.0,
        ge=0,
        description="With best fit and preemption on (`preempt_margin` set, as by default): a "
        "job that would wait this long while enough GPUs stand free, but on no one host, pauses "
        "pausable jobs on one host at a checkpoint so they start again at once on other hosts "
        "(the redone work since their checkpoints against the wait; measured in "
        "docs/benchmarks.md); a move is a preemption and counts against "
        "`preempt_max_per_call`; None: never move a job",
    )
    tariff_horizon_h: float = Field(168.0, gt=0)
    long_job_start_grace_min: float = Field(30.0, ge=0)
    display_tz: str | None = Field(
        None, description="Zone for times in hold reasons; default: the tariff's"
    )
    sweep_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="The share of this node's GPUs (of its CPU slots, for CPU-only trials) that "
        "one sweep's trials may hold at once (`nightshift sweep`); at least one trial",
    )

    def snapshot_fields(self) -> dict[str, Any]:
        """The placement Snapshot's fields these settings set, in its units (seconds where a
        setting says minutes): the engine applies them, and the benchmarks of the daemon's
        defaults take them from here, so that a new setting is not mirrored by hand."""
        minutes = self.migrate_after_min
        return {
            "aging_per_hour": self.aging_per_hour,
            "preempt_margin": self.preempt_margin,
            "default_duration_s": self.default_duration_min * 60,
            "tariff_horizon_h": self.tariff_horizon_h,
            "preempt_max_per_call": self.preempt_max_per_call,
            "long_job_start_grace_s": self.long_job_start_grace_min * 60,
            "display_tz": self.display_tz,
            "cost_threshold": (
                self.cost_threshold_per_kwh
                if self.cost_threshold_per_kwh is not None
                else self.cost_band
            ),
            "hold_slack_s": self.hold_slack_min * 60,
            "hold_min_gpu_h": self.hold_min_gpu_h,
            "hold_max_wait_s": (
                self.hold_max_wait_h * 3600 if self.hold_max_wait_h is not None else None
            ),
            "order": self.order,
            "promote_after_h": self.promote_after_h,
            "preempt_wider": self.preempt_wider,
            "preempt_min_left_s": self.preempt_min_left_min * 60,
            "host_fit": self.host_fit,
            "migrate_after_s": minutes * 60 if minutes is not None else None,
        }


class LlmSettings(BaseModel):
    """The model endpoint that `planner: llm` goals and `nightshift chat` plan with: any
    OpenAI-compatible server (OpenAI, vLLM, Ollama, llama.cpp's server). The standard variables
    OPENAI_BASE_URL, OPENAI_API_KEY and NIGHTSHIFT_MODEL set it too (NIGHTSHIFT_LLM__* wins).
    The key is a secret: never printed, logged or audited, and never read from a config file that
    others can read."""

    base_url: str | None = Field(
        None,
        description="The server's OpenAI API root, e.g. http://127.0.0.1:8080/v1; "
        "env OPENAI_BASE_URL. None: no model (the deterministic planner only)",
    )
    model: str | None = Field(
        None, description="The model's name as the server knows it; env NIGHTSHIFT_MODEL"
    )
    api_key: SecretStr | None = Field(
        None,
        description="Bearer token; env OPENAI_API_KEY (a local server may need none)",
    )
    api_key_file: str | None = Field(
        None, description="A file holding the key, readable by its owner only (chmod 600)"
    )
    timeout_s: float = Field(60.0, gt=0, description="One request's time limit")
    max_retries: int = Field(
        2, ge=0, le=10, description="Retries of a request that timed out, 429 or 5xx"
    )
    max_steps: int = Field(30, ge=1, description="Model calls per goal")
    max_tokens: int = Field(200_000, ge=1, description="Prompt plus completion tokens per goal")
    max_bad_calls: int = Field(
        3,
        ge=1,
        description="Refused calls in a row (bad arguments, unknown tool) the model may retry",
    )
    max_tool_result_chars: int = Field(
        12_000, ge=500, description="With all_tools: a tool result longer than this is cut"
    )
    max_reply_tokens: int = Field(
        512,
        ge=16,
        description="Tokens one reply may generate (sent as max_tokens): a tool call needs few, "
        "and a small model that rambles is stopped instead of holding the server for minutes",
    )
    prompt_budget: int = Field(
        1500,
        ge=300,
        description="Prompt tokens a step aims at: the tools offered are chosen by the request's "
        "intent and older results are shortened to fit. Raise it for a large-context model",
    )
    all_tools: bool = Field(
        False,
        description="Send every tool, the long system prompt and raw results on every step "
        "(large-context models; about 8,000 tokens a step before the conversation)",
    )
    observation_chars: int = Field(
        600, ge=100, description="A tool result reaches the model as a summary this long at most"
    )
    tool_mode: Literal["tools", "json_schema", "json_object"] = Field(
        "tools",
        description="How the model makes its call: `tools` (the server parses tool calls), or "
        "one JSON object {name, arguments} under a response_format schema, which a server with "
        "constrained decoding cannot let the model break: `json_schema` (OpenAI's form: vLLM, "
        "llama.cpp's server) or `json_object` (with a `schema`: llama-cpp-python's server). "
        "`nightshift doctor` says which the endpoint offers",
    )
    max_repeats: int = Field(
        2,
        ge=1,
        description="Times the model may make the same call (same tool, same arguments) in a goal",
    )
    price_in_per_1k: float | None = Field(
        None, ge=0, description="Price per 1000 prompt tokens, for the cost per step"
    )
    price_out_per_1k: float | None = Field(
        None, ge=0, description="Price per 1000 completion tokens"
    )

    @field_validator("base_url")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^/\s]+", v.strip()):
            raise ValueError(f"{v!r} is not an http(s) URL such as http://127.0.0.1:8080/v1")
        return v.strip().rstrip("/") if v is not None else v


class SlackSettings(BaseModel):
    """A Slack app that posts approval cards and notifications (agent/doors/channels/slack.py). The
    tokens and the signing secret come from the environment (SLACK_BOT_TOKEN,
    SLACK_SIGNING_SECRET, SLACK_APP_TOKEN) or `channels.secrets_file`, never a readable file."""

    bot_token: SecretStr | None = Field(None, description="xoxb-… token; env SLACK_BOT_TOKEN")
    signing_secret: SecretStr | None = Field(
        None, description="Checks the interactivity endpoint's requests; env SLACK_SIGNING_SECRET"
    )
    app_token: SecretStr | None = Field(
        None, description="xapp-… app-level token for Socket Mode; env SLACK_APP_TOKEN"
    )
    socket_mode: bool = Field(
        False, description="Receive clicks over Socket Mode instead of the HTTP endpoint"
    )
    approvals_channel: str | None = Field(None, description="Channel id approval cards go to")
    notify_channel: str | None = Field(
        None, description="Channel id for notifications; default approvals_channel"
    )
    base_url: str = Field("https://slack.com/api/", description="The Web API's root")

    @property
    def configured(self) -> bool:
        return bool(self.bot_token and self.approvals_channel)


class WeChatSettings(BaseModel):
    """A WeChat Work (企业微信) self-built app that sends approval cards and notifications
    (agent/doors/channels/wechat.py), and optionally a group robot for notifications. The app's secret,
    the callback token and EncodingAESKey and the robot's URL are secrets."""

    corp_id: str | None = Field(None, description="The corporation id (corpid)")
    agent_id: int | None = Field(None, description="The app's AgentId")
    secret: SecretStr | None = Field(None, description="The app's Secret; env WECOM_SECRET")
    token: SecretStr | None = Field(None, description="The callback Token; env WECOM_TOKEN")
    encoding_aes_key: SecretStr | None = Field(
        None, description="The callback EncodingAESKey (43 characters); env WECOM_ENCODING_AES_KEY"
    )
    approvers: list[str] | None = Field(
        None,
        description="WeChat user ids cards go to; default the wechat_id of every principal "
        "whose role may approve",
    )
    robot_webhook: SecretStr | None = Field(
        None, description="A group robot's webhook URL, for notifications; env WECOM_ROBOT_WEBHOOK"
    )
    base_url: str = Field("https://qyapi.weixin.qq.com/cgi-bin/", description="The API's root")

    @property
    def configured(self) -> bool:
        return bool(self.corp_id and self.agent_id is not None and self.secret)


class ChannelsSettings(BaseModel):
    """Where approval requests and notifications go besides the CLI and the TUI, and the
    daemon's endpoint for the clicks that come back."""

    slack: SlackSettings = SlackSettings()
    wechat: WeChatSettings = WeChatSettings()
    secrets_file: str | None = Field(
        None,
        description="A YAML file of secrets ({slack: {bot_token, …}, wechat: {secret, …}}); the "
        "daemon refuses to start if its group or others may read it",
    )
    listen: str | None = Field(
        "127.0.0.1:8787",
        description="host:port of the callback endpoint (/slack/interactivity, "
        "/wechat/callback) that a reverse proxy or tunnel exposes; null: none",
    )
    notify: list[str] = Field(
        default_factory=lambda: [
            "job_failed",
            "job_recovered",
            "job_finished",
            "job_early_stopped",
            "report",
        ],
        description="Notice kinds sent to every configured channel",
    )
    retry_max_s: float = Field(
        300.0, gt=0, description="Longest wait between tries of a message a channel refused"
    )
    report_at: str | None = Field(
        "07:00",
        pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$",
        description="Local time (HH:MM) the daemon posts the last 24 hours' report; null: never",
    )
    failure_notice_wait_s: float = Field(
        30.0,
        ge=0,
        description="A failure's notice waits up to this long for its diagnosis",
    )
    callback_requests_per_s: float = Field(
        20.0,
        gt=0,
        description="Callback requests a second from one remote address, beyond its burst; "
        "past it: 429 with Retry-After",
    )
    callback_burst: int = Field(
        100, ge=1, description="Callback requests one remote address may send at once"
    )
    callback_max_connections_per_peer: int = Field(
        32, ge=1, description="Open connections to the callback endpoint per remote address"
    )
    callback_max_connections: int = Field(
        256, ge=1, description="Open connections to the callback endpoint in all"
    )
    refusals_in_full_per_minute: int = Field(
        10,
        ge=0,
        description="Refused callbacks audited one by one (channel.refused) per remote address "
        "and minute; the rest are counted into one channel.refused_aggregate event",
    )

    @field_validator("listen")
    @classmethod
    def _host_port(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError(f"{v!r} is not host:port, such as 127.0.0.1:8787")
        return v


class WebSettings(BaseModel):
    """The daemon's one HTTP application: the channels' callbacks, /metrics, the dashboard."""

    listen: str | None = Field(
        None,
        description="host:port of the daemon's HTTP app (loopback by default; a reverse proxy "
        "for more); null: on channels.listen, and only where a channel receives callbacks",
    )
    dashboard: bool = Field(
        True,
        description="Serve the web dashboard on web.listen (sign in with `nightshift web token`)",
    )

    @field_validator("listen")
    @classmethod
    def _host_port(cls, v: str | None) -> str | None:
        return ChannelsSettings._host_port(v)


class MetricsSettings(BaseModel):
    """Prometheus metrics at /metrics on the daemon's HTTP app."""

    enabled: bool = Field(
        True, description="Serve /metrics wherever the daemon's HTTP app runs (web.listen)"
    )
    scrape_timeout_s: float = Field(
        5.0, gt=0, description="A scrape that waits longer than this for the store gets a 503"
    )


class IdleGpuSettings(BaseModel):
    """A GPU that does nothing while work waits, or that a running job holds without using."""

    enabled: bool = True
    threshold_pct: float = Field(
        10.0, ge=0, le=100, description="Utilisation under this counts as idle"
    )
    for_s: float = Field(
        3600.0, gt=0, description="Idle this long (by the health checks' readings) → one notice"
    )


class AlertsSettings(BaseModel):
    idle_gpu: IdleGpuSettings = IdleGpuSettings()


class MlflowSettings(BaseModel):
    """Each job mirrored as an MLflow run (runtime/training/mlflow_mirror.py)."""

    uri: str | None = Field(
        None,
        description="The MLflow tracking server (http://host:port); null: no mirroring. Jobs get "
        "MLFLOW_TRACKING_URI and MLFLOW_RUN_ID",
    )
    experiment: str = Field("nightshift", min_length=1, description="The MLflow experiment")
    interval_s: float = Field(5.0, gt=0, description="How often the mirror's worker syncs")
    batch: int = Field(
        5000, ge=1, description="Metric points sent per job in one sync, at most (bounded)"
    )
    timeout_s: float = Field(5.0, gt=0, description="One request to MLflow, at most")
    launch_wait_s: float = Field(
        2.0,
        ge=0,
        description="A launch waits this long, at most, for its job's MLflow run to exist (then "
        "starts without MLFLOW_RUN_ID); not at all while MLflow is known to be down",
    )
    max_artifact_mb: float = Field(
        50.0, gt=0, description="A log or plot larger than this is not uploaded (its end is)"
    )


class TrackingSettings(BaseModel):
    mlflow: MlflowSettings = MlflowSettings()


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_DELIMITER,
        env_parse_none_str="null",
        env_ignore_empty=True,  # `NIGHTSHIFT_X= cmd` unsets, as an empty NIGHTSHIFT_HOME does
        # Not every NIGHTSHIFT_* variable, nor every key of a config file, is a setting.
        extra="ignore",
        validate_default=False,  # BaseSettings' default is True; these defaults are ours, and valid
    )

    home: str = Field(
        default_factory=lambda: str(nightshift_home()),
        description="The state folder: $NIGHTSHIFT_HOME, default ~/.nightshift",
    )
    store: StoreSettings = StoreSettings()
    audit: AuditSettings = AuditSettings()
    executor: ExecutorSettings = ExecutorSettings()
    gpu: GpuSettings = GpuSettings()
    health: HealthThresholds = HealthThresholds()
    policy: PolicySettings = PolicySettings()
    api: ApiSettings = ApiSettings()
    loop: LoopSettings = LoopSettings()
    stall: StallSettings = StallSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    retry: Backoff = Backoff()
    llm: LlmSettings = LlmSettings()
    channels: ChannelsSettings = ChannelsSettings()
    web: WebSettings = WebSettings()
    metrics: MetricsSettings = MetricsSettings()
    alerts: AlertsSettings = AlertsSettings()
    tracking: TrackingSettings = TrackingSettings()
    power: PowerSettings = PowerSettings()
    tariff: Tariff | None = Field(
        None, description="Time-of-use price windows; None: no tariff holds"
    )

    @field_validator("home", mode="before")
    @classmethod
    def _expand_home(cls, v: Any) -> Any:
        return str(home_from(v)) if v is None or isinstance(v, str | os.PathLike) else v

    @property
    def home_path(self) -> Path:
        return Path(self.home)

    @property
    def node(self) -> str:
        """`loop.node`, else this host's name."""
        return self.loop.node or socket.gethostname()

    @property
    def store_url(self) -> str:
        return self.store.url or f"sqlite:///{self.home_path / 'nightshift.db'}"

    @property
    def runs_dir(self) -> Path:
        return Path(self.executor.runs_dir) if self.executor.runs_dir else self.home_path / "runs"

    @property
    def audit_key_file(self) -> Path:
        """The key that signs the audit events: `audit.key_file`, else
        `$NIGHTSHIFT_HOME/keys/audit.key`."""
        if self.audit.key_file:
            return Path(self.audit.key_file).expanduser()
        return self.home_path / "keys" / "audit.key"

    @property
    def api_socket(self) -> Path:
        """The daemon's API socket: `api.socket`, else `$NIGHTSHIFT_HOME/api.sock`."""
        return (
            Path(self.api.socket).expanduser() if self.api.socket else self.home_path / "api.sock"
        )

    @property
    def serves_others(self) -> bool:
        """Whether the daemon's API is for other users: it serves a socket outside its own
        (0700) home that its mode lets others connect to."""
        home = self.home_path.expanduser().resolve()
        sock = self.api_socket.resolve()
        return (
            self.api.serve
            and not sock.is_relative_to(home)
            and bool(self.api.socket_mode_bits & 0o022)
        )

    @property
    def run_cgroups(self) -> Literal["auto", "required", "off"]:
        """executor.cgroups, with auto made required where jobs run as their submitters."""
        mode = self.executor.cgroups
        return "required" if mode == "auto" and self.jobs_run_as_submitter else mode

    @property
    def jobs_run_as_submitter(self) -> bool:
        """executor.run_as, with auto decided by `serves_others`."""
        if self.executor.run_as == "auto":
            return self.serves_others
        return self.executor.run_as == "submitter"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        load = _LOADING.get()
        if load is None:  # built in code: its arguments over the defaults, nothing else
            return (init_settings,)
        env_vars = getattr(env_settings, "env_vars", None)
        if isinstance(env_vars, dict):  # it matches every variable against every field: only ours
            env_settings.env_vars = {  # type: ignore[attr-defined]  # EnvSettingsSource's
                k: v for k, v in env_vars.items() if k.upper().startswith(ENV_PREFIX)
            }
        sources: list[Any] = [
            init_settings,
            _Recorded(env_settings, load.env, _env_failure),
            _Recorded(_StandardEnv(), load.standard_env),
        ]
        if load.file is not None:
            sources.append(_Recorded(_YamlFile(settings_cls, yaml_file=load.file), load.from_file))
        return tuple(sources)


# ------------------------------------------------------------------------------------ loading
class _Load:
    """One `load_settings` call: the config file to read, and what each source contributed."""

    def __init__(self, file: Path | None):
        self.file = file
        self.env: dict[str, Any] = {}
        self.standard_env: dict[str, Any] = {}
        self.from_file: dict[str, Any] = {}


_LOADING: ContextVar[_Load | None] = ContextVar("nightshift_settings_load", default=None)


class _Recorded:
    """A settings source whose values are kept for `load_settings_with_sources`."""

    def __init__(
        self,
        source: Callable[[], dict[str, Any]],
        into: dict[str, Any],
        on_error: Callable[[SettingsError], ConfigError] | None = None,
    ):
        self.source, self.into, self.on_error = source, into, on_error
        self.__name__ = type(source).__name__

    def __call__(self) -> dict[str, Any]:
        try:
            data = self.source()
        except SettingsError as exc:
            if self.on_error is None:
                raise
            raise self.on_error(exc) from exc
        self.into.update(data)
        return data


# The variables other tools already read, as settings (below NIGHTSHIFT_*): every OpenAI client's
# and ours for the model; Slack's and WeChat Work's usual names for an app's secrets.
STANDARD_ENV: dict[str, tuple[str, ...]] = {
    "OPENAI_BASE_URL": ("llm", "base_url"),
    "OPENAI_API_KEY": ("llm", "api_key"),
    "NIGHTSHIFT_MODEL": ("llm", "model"),
    "SLACK_BOT_TOKEN": ("channels", "slack", "bot_token"),
    "SLACK_SIGNING_SECRET": ("channels", "slack", "signing_secret"),
    "SLACK_APP_TOKEN": ("channels", "slack", "app_token"),
    "WECOM_SECRET": ("channels", "wechat", "secret"),
    "WECOM_TOKEN": ("channels", "wechat", "token"),
    "WECOM_ENCODING_AES_KEY": ("channels", "wechat", "encoding_aes_key"),
    "WECOM_ROBOT_WEBHOOK": ("channels", "wechat", "robot_webhook"),
}
CHANNEL_SECRETS = {
    "slack": ("bot_token", "signing_secret", "app_token"),
    "wechat": ("secret", "token", "encoding_aes_key", "robot_webhook"),
}


class _StandardEnv:
    """The variables of STANDARD_ENV that are set, nested as their settings."""

    __name__ = "StandardEnv"

    def __call__(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for var, path in STANDARD_ENV.items():
            if os.environ.get(var):
                section = found
                for part in path[:-1]:
                    section = section.setdefault(part, {})
                section[path[-1]] = os.environ[var]
        return found


def _standard_env_sets(load: _Load, path: tuple[str, ...]) -> bool:
    value: Any = load.standard_env
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    return True


class _YamlFile(YamlConfigSettingsSource):
    """pydantic-settings' YAML source, whose every problem is a ConfigError naming the file."""

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        try:
            loaded = yaml.safe_load(Path(file_path).read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            why = getattr(exc, "problem", None) or str(exc)
            raise ConfigError(f"{file_path}: not valid YAML{at}: {why}") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{file_path}: cannot be read: {exc}") from exc
        if loaded is None:
            return {}
        if not isinstance(loaded, dict) or not all(isinstance(k, str) for k in loaded):
            raise ConfigError(f"{file_path}: expected a mapping of sections")
        if "home" in loaded:
            raise ConfigError(
                f"{file_path}: 'home' cannot be set in the config file, which lives "
                "in it; set NIGHTSHIFT_HOME"
            )
        llm = loaded.get("llm")
        if isinstance(llm, dict) and llm.get("api_key") and _others_may_read(Path(file_path)):
            raise ConfigError(
                f"{file_path}: llm.api_key is a secret and others may read this file: "
                f"`chmod 600 {file_path}`, or set OPENAI_API_KEY, or name a file of your own "
                "in llm.api_key_file"
            )
        channels = loaded.get("channels")
        if isinstance(channels, dict) and _others_may_read(Path(file_path)):
            for channel, keys in CHANNEL_SECRETS.items():
                section = channels.get(channel)
                named = [k for k in keys if isinstance(section, dict) and section.get(k)]
                if named:
                    raise ConfigError(
                        f"{file_path}: channels.{channel}.{named[0]} is a secret and others may "
                        f"read this file: `chmod 600 {file_path}`, or set it in the environment, "
                        "or in channels.secrets_file"
                    )
        # `loop:` with nothing under it is the section at its defaults, as is leaving it out.
        return {section: values for section, values in loaded.items() if values is not None}


def _others_may_read(path: Path) -> bool:
    """Whether the group or anyone else may read `path`."""
    try:
        return bool(path.stat().st_mode & 0o044)
    except OSError:
        return False


def _env_names() -> dict[str, str]:
    """NIGHTSHIFT_* variables, upper-cased → as spelled (pydantic-settings ignores the case)."""
    return {k.upper(): k for k in os.environ if k.upper().startswith(ENV_PREFIX)}


def _env_vars_for(section: str, names: dict[str, str] | None = None) -> list[str]:
    """The environment variables (as spelled there) that set config section `section`."""
    whole, nested = (
        f"{ENV_PREFIX}{section}".upper(),
        f"{ENV_PREFIX}{section}{ENV_DELIMITER}".upper(),
    )
    names = _env_names() if names is None else names
    return sorted(k for up, k in names.items() if up == whole or up.startswith(nested))


_FIELD_IN_MESSAGE = re.compile(r'field "([^"]+)"')


def _env_failure(exc: SettingsError) -> ConfigError:
    """A value pydantic-settings could not decode (bad JSON for a list, mapping or section)."""
    m = _FIELD_IN_MESSAGE.search(str(exc))
    section = m.group(1) if m else "?"
    cause = exc.__cause__
    while cause is not None and cause.__cause__ is not None:  # down to json's own message
        cause = cause.__cause__
    why = f"not valid JSON ({cause})" if cause else str(exc)
    names = ", ".join(_env_vars_for(section)) or f"{ENV_PREFIX}{section.upper()}"
    return ConfigError(f"config field {section}: {why} (from env {names})")


def _env_name(section: str, key: str, names: dict[str, str]) -> str:
    """The variable that set `section.key`: NIGHTSHIFT_SECTION__KEY, or the whole section's."""
    nested, whole = (
        f"{ENV_PREFIX}{section}{ENV_DELIMITER}{key}".upper(),
        f"{ENV_PREFIX}{section}".upper(),
    )
    return names.get(nested) or names.get(whole, whole)


def _origins(load: _Load) -> dict[str, str]:
    """'section' and 'section.key' → where the value came from; the environment wins."""
    out: dict[str, str] = {}
    file = str(load.file)
    for section, values in load.from_file.items():
        out[section] = file
        for k in values if isinstance(values, dict) else ():
            out[f"{section}.{k}"] = file
    for var, path in STANDARD_ENV.items():
        if _standard_env_sets(load, path):
            out[path[0]] = out[".".join(path[:2])] = f"env {var}"
    names = _env_names() if load.env else {}
    for section, values in load.env.items():
        if section == "home":
            continue  # the state folder: NIGHTSHIFT_HOME, which load_settings passes itself
        out[section] = (
            f"env {', '.join(_env_vars_for(section, names)) or ENV_PREFIX + section.upper()}"
        )
        for k in values if isinstance(values, dict) else ():
            out[f"{section}.{k}"] = f"env {_env_name(section, k, names)}"
    return out


def _origin_of(loc: tuple[Any, ...], origins: dict[str, str]) -> str:
    """The source of the value at `loc`, or of the nearest enclosing value that has one."""
    for n in range(len(loc), 0, -1):
        key = ".".join(str(p) for p in loc[:n])
        if key in origins:
            return origins[key]
    return "defaults"


def load_settings(path: str | Path | None = None) -> Settings:
    """Defaults ← config file ← environment. Raises ConfigError naming the field."""
    return _load(path)[0]


def load_settings_with_sources(path: str | Path | None = None) -> tuple[Settings, dict[str, str]]:
    """The settings, and 'section.key' → the config file or `env NIGHTSHIFT_SECTION__KEY` that
    set it (keys at their defaults are absent)."""
    settings, load = _load(path)
    return settings, {k: v for k, v in _origins(load).items() if "." in k}


def _load(path: str | Path | None) -> tuple[Settings, _Load]:
    home = nightshift_home()
    cfg_path = Path(path).expanduser() if path else home / "config.yaml"
    try:
        exists = cfg_path.exists()
    except PermissionError:  # a folder above it is not ours to enter
        raise ConfigError(
            f"{cfg_path}: cannot be read (permission denied)"
            + (
                ""
                if path
                else f": NIGHTSHIFT_HOME {home} is another user's (a shared install's daemon's?); "
                "a client keeps a home of its own and sets api.socket"
            )
        ) from None
    if path and not exists:
        raise ConfigError(f"--config {cfg_path}: file not found")
    if exists and not cfg_path.is_file():
        raise ConfigError(f"{cfg_path}: not a file")
    load = _Load(cfg_path if exists else None)
    token = _LOADING.set(load)
    try:
        settings = Settings(home=str(home))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        source = _origin_of(first["loc"], _origins(load))
        raise ConfigError(f"config field {where}: {first['msg']} (from {source})") from exc
    except SettingsError as exc:  # not raised by the sources above; kept one line all the same
        raise ConfigError(f"config: {exc}") from exc
    finally:
        _LOADING.reset(token)
    if settings.policy.principal is not None:
        source = _origin_of(("policy", "principal"), _origins(load))
        raise ConfigError(
            f"config field policy.principal is no longer a setting (from {source}): a name "
            "anyone can set is not who asks. nightshift takes it from the kernel: your OS user "
            "here, or your uid on the daemon's socket in a shared install (`nightshift whoami`). "
            "Remove it; another person approves from their own account"
        )
    if settings.power.cap_at_peak and settings.tariff is None:
        source = _origin_of(("power", "cap_at_peak"), _origins(load))
        raise ConfigError(
            f"config field power.cap_at_peak: true needs a tariff (from {source}): the peak is "
            "the tariff's highest price. Add a tariff section, or set power.cap_at_peak: false"
        )
    return settings, load
