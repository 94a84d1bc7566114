"""The channels as the daemon runs them: built from the settings and the secrets file, the
outbox ticking in its own thread (a slow or unreachable channel never holds up the scheduling
loop), the callback endpoint and Slack's Socket Mode client receiving clicks.

Secrets (Slack's tokens and signing secret, WeChat Work's app secret, callback token,
EncodingAESKey and robot URL) come from the environment, from a config file only its owner can
read, or from `channels.secrets_file`, which must not be readable by its group or others: the
daemon refuses to start otherwise. They are never printed, logged or audited.
"""

from __future__ import annotations

import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import SecretStr, ValidationError

from nightshift.agent.brain.wiring import local_now
from nightshift.agent.doors.channels.base import Channel, Notice
from nightshift.agent.doors.channels.callbacks import (
    CallbackServer,
    Desk,
    Route,
    slack_route,
    wechat_route,
)
from nightshift.agent.doors.channels.outbox import Outbox
from nightshift.policies.engine import PolicyEngine
from nightshift.runtime.config import CHANNEL_SECRETS, ChannelsSettings
from nightshift.runtime.errors import ConfigError

if TYPE_CHECKING:
    from nightshift.agent.brain.wiring import Wiring

TICK_S = 1.0


@dataclass
class Built:
    """What the settings configure: the channels to send to and the receivers of clicks."""

    channels: dict[str, Channel] = field(default_factory=dict)
    routes: dict[str, Any] = field(default_factory=dict)  # path → verifier (decide/verify_url)
    socket_mode: dict[str, str] = field(default_factory=dict)  # Slack's app token and base URL


def with_secrets(cfg: ChannelsSettings) -> ChannelsSettings:
    """The settings with what `secrets_file` holds filled in where the environment and the
    config file left a secret unset. ConfigError for a file its group or others may read."""
    if not cfg.secrets_file:
        return cfg
    path = Path(cfg.secrets_file).expanduser()
    try:
        mode = path.stat().st_mode
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ConfigError(
            f"channels.secrets_file {path}: cannot be read ({exc.strerror})"
        ) from None
    except yaml.YAMLError:
        raise ConfigError(f"channels.secrets_file {path}: not valid YAML") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"channels.secrets_file {path}: its group or others may read it; "
            f"`chmod 600 {path}` (it holds secrets)"
        )
    if not isinstance(data, dict):
        raise ConfigError(f"channels.secrets_file {path}: expected slack: and wechat: sections")
    merged = cfg.model_dump()
    for channel, keys in CHANNEL_SECRETS.items():
        given = data.get(channel) or {}
        if not isinstance(given, dict):
            raise ConfigError(f"channels.secrets_file {path}: {channel} must be a mapping")
        unknown = sorted(set(given) - set(keys))
        if unknown:
            raise ConfigError(
                f"channels.secrets_file {path}: {channel}.{unknown[0]} is not a secret it "
                f"takes ({', '.join(keys)}); other settings go in config.yaml"
            )
        for key in keys:
            if merged[channel].get(key) is None and given.get(key):
                merged[channel][key] = SecretStr(str(given[key]))
    try:
        return ChannelsSettings.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(f"channels.secrets_file {path}: {exc.errors()[0]['msg']}") from None


def _secret(value: SecretStr | None) -> str:
    return value.get_secret_value() if value is not None else ""


def build(cfg: ChannelsSettings, policy: PolicyEngine) -> Built:
    """The configured channels; ConfigError naming the missing setting when one is half set."""
    cfg = with_secrets(cfg)
    out = Built()
    slack = cfg.slack
    if slack.bot_token or slack.approvals_channel:
        if not slack.configured:
            raise ConfigError(
                "channels.slack needs both bot_token (env SLACK_BOT_TOKEN) and "
                "approvals_channel (a channel id such as C0123456789)"
            )
        from nightshift.agent.doors.channels.slack import SlackChannel, SlackInteractivity

        out.channels["slack"] = SlackChannel(
            _secret(slack.bot_token),
            approvals_channel=slack.approvals_channel or "",
            notify_channel=slack.notify_channel,
            base_url=slack.base_url,
        )
        if slack.socket_mode:
            if not slack.app_token:
                raise ConfigError(
                    "channels.slack.socket_mode needs app_token (an xapp-… app-level token "
                    "with connections:write; env SLACK_APP_TOKEN)"
                )
            out.socket_mode = {"app_token": _secret(slack.app_token), "base_url": slack.base_url}
        elif slack.signing_secret:
            out.routes["/slack/interactivity"] = SlackInteractivity(_secret(slack.signing_secret))
        else:
            raise ConfigError(
                "channels.slack cannot receive clicks: set signing_secret (env "
                "SLACK_SIGNING_SECRET) for the interactivity URL, or socket_mode: true with "
                "app_token"
            )
    wechat = cfg.wechat
    if wechat.corp_id or wechat.secret or wechat.agent_id is not None:
        if not wechat.configured:
            raise ConfigError(
                "channels.wechat needs corp_id, agent_id and secret (env WECOM_SECRET)"
            )
        if not (wechat.token and wechat.encoding_aes_key):
            raise ConfigError(
                "channels.wechat cannot receive clicks: set token and encoding_aes_key (env "
                "WECOM_TOKEN, WECOM_ENCODING_AES_KEY), as on the app's API receive page"
            )
        from nightshift.agent.doors.channels.wechat import WeComCallback, WeComChannel

        approvers = wechat.approvers
        if approvers is None:
            approvers = sorted(
                p.wechat_id
                for name, p in policy.policy.principals.items()
                if p.wechat_id and policy.may_approve(name)
            )
        try:
            out.channels["wechat"] = WeComChannel(
                wechat.corp_id or "",
                wechat.agent_id or 0,
                _secret(wechat.secret),
                approvers=list(approvers),
                base_url=wechat.base_url,
                robot_webhook=_secret(wechat.robot_webhook) or None,
            )
            out.routes["/wechat/callback"] = WeComCallback(
                _secret(wechat.token), _secret(wechat.encoding_aes_key), wechat.corp_id or ""
            )
        except ValueError as exc:  # an approver id, the webhook URL or the key is malformed
            raise ConfigError(f"channels.wechat: {exc}") from None
    return out


REPORT_DAY = "channels.report_day"


def report_notice(w: Wiring, now: datetime, day: str, hours: float = 24.0) -> Notice:
    """The report of the `hours` before `now` as a notice (its key names `day`: one each)."""
    from nightshift.agent.doors.report import report_of, summary_lines

    r = report_of(w, now - timedelta(hours=hours), now)
    return Notice(
        key=f"report:{day}",
        kind="report",
        title=f"nightshift report for the {hours:g} hours to {now:%Y-%m-%d %H:%M} UTC",
        lines=tuple(summary_lines(r)),
    )


class ChannelService:
    """The daemon's channels: start() after the store is open, stop() before it closes."""

    def __init__(
        self, w: Wiring, say: Callable[[str], None], clock: Callable[[], datetime] = local_now
    ):
        self.w, self.say, self.clock = w, say, clock
        self.built = build(w.settings.channels, w.policy)
        self.outbox = Outbox(
            w.store,
            w.audit,
            w.approvals,
            w.policy,
            w.settings.channels,
            self.built.channels,
            clock,
        )
        self.desk = Desk(
            w.store,
            w.audit,
            w.approvals,
            self.outbox,
            clock,
            in_full_per_minute=w.settings.channels.refusals_in_full_per_minute,
        )
        self.server: CallbackServer | None = None
        self.socket: Any = None
        self._socket_down = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> bool:
        return bool(self.built.channels)

    def routes(self) -> dict[str, Route]:
        """The callbacks to serve, by path: those of the channels that receive clicks over
        HTTP."""
        routes: dict[str, Route] = {}
        if "/slack/interactivity" in self.built.routes:
            routes["/slack/interactivity"] = slack_route(
                self.built.routes["/slack/interactivity"], self.desk
            )
        if "/wechat/callback" in self.built.routes:
            routes["/wechat/callback"] = wechat_route(
                self.built.routes["/wechat/callback"], self.desk
            )
        return routes

    def start(self, *, outbox_thread: bool = True, serve: bool = True) -> None:
        """Serve callbacks and send; without `outbox_thread` the caller ticks the outbox (one
        ticker at a time: two would send a due message twice). Without `serve` the caller
        serves `routes()` on its own HTTP app (the daemon's, with /metrics)."""
        if not self.active:
            return
        listen = self.w.settings.channels.listen
        routes = self.routes() if serve and listen else {}
        if routes:
            try:
                self.server = CallbackServer(
                    listen,
                    routes,
                    self.say,
                    limits=self.w.settings.channels,
                    refusals=self.desk.refusals,
                )
            except OSError as exc:
                raise ConfigError(
                    f"channels.listen {listen}: cannot listen ({exc.strerror or exc})"
                ) from None
            self.server.start()
            self.say(f"channel callbacks on {self.server.address} ({', '.join(routes)})")
        if self.built.socket_mode:
            from nightshift.agent.doors.channels.slack import SlackSocketMode

            self.socket = SlackSocketMode(
                self.built.socket_mode["app_token"],
                on_decision=self._socket_decision,
                on_refused=lambda why: self.desk.refuse("slack", why),
                base_url=self.built.socket_mode["base_url"],
            )
            self._connect_socket()
        if outbox_thread:
            self._thread = threading.Thread(target=self._run, name="channel-outbox", daemon=True)
            self._thread.start()
        self.say(f"channels: {', '.join(self.built.channels)}")

    def _connect_socket(self) -> None:
        """Open Socket Mode; while Slack refuses (apps.connections.open failing), say so once
        and let the outbox thread try again each tick."""
        from nightshift.agent.doors.channels.base import ChannelDown

        try:
            self.socket.start()
        except ChannelDown as exc:
            if not self._socket_down:
                self.say(f"Slack Socket Mode: {exc}; trying again")
            self._socket_down = True
            return
        if self._socket_down:
            self.say("Slack Socket Mode: connected")
        self._socket_down = False

    def _socket_decision(self, decision: Any) -> None:
        from nightshift.agent.doors.channels.callbacks import Refused

        try:
            self.desk.decide(decision)
        except Refused:
            pass  # audited

    def _run(self) -> None:
        failing: str | None = None
        while not self._stop.is_set():
            if self._socket_down:
                self._connect_socket()
            try:
                self.morning_report()
                self.outbox.tick()
                if failing:
                    self.say("channel outbox: working again")
                failing = None
            except Exception as exc:  # the store busy or full: said once, tried again
                why = f"{type(exc).__name__}: {exc}"
                if why != failing:
                    self.say(f"channel outbox: {why}; trying again")
                failing = why
            self._stop.wait(TICK_S)

    def morning_report(self) -> bool:
        """Queue the last 24 hours' report once a day, at `channels.report_at` local time."""
        cfg = self.w.settings.channels
        if not cfg.report_at or "report" not in cfg.notify or not self.active:
            return False
        now = self.clock()
        local = now.replace(tzinfo=UTC).astimezone()
        hour, minute = (int(x) for x in cfg.report_at.split(":"))
        day = local.date().isoformat()
        if (local.hour, local.minute) < (hour, minute) or self.w.store.get_kv(REPORT_DAY) == day:
            return False
        self.outbox.queue_notice(report_notice(self.w, now, day))
        self.w.store.set_kv(REPORT_DAY, day)
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.socket is not None:
            self.socket.stop()
        if self.server is not None:
            self.server.stop()
