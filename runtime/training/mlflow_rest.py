"""A small client of MLflow's tracking REST API (`/api/2.0/mlflow/...`, and the artifact proxy
`/api/2.0/mlflow-artifacts/artifacts/...` that `mlflow server` serves by default), on `httpx`.

Why not `mlflow-skinny`: it would add eleven packages (databricks-sdk, fastapi, GitPython, ...)
to the daemon's environment for the dozen calls the mirror makes, and its own retries wait
minutes by default; here each call has one timeout and a few short retries, so the mirror's
worker, not the loop, is the only thing an unreachable server slows down.

Errors: `MlflowUnavailable` (the server did not answer, or answered 5xx/429, after the retries:
try again later) and `MlflowRefused` (a 4xx: this request will never succeed as it is)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx

# MLflow's own limits on one log-batch request.
MAX_METRICS = 1000
MAX_PARAMS = 100
MAX_TAGS = 100
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000


class MlflowError(Exception):
    """An MLflow request that did not succeed."""


class MlflowUnavailable(MlflowError):
    """MLflow did not answer, or answered that it cannot now (5xx, 429): retried later."""


class MlflowRefused(MlflowError):
    """MLflow answered that the request is wrong (4xx): sending it again will not help."""

    def __init__(self, message: str, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.code, self.status = code, status


class MlflowClient:
    """The calls the mirror needs, each with `timeout_s` and up to `retries` quick retries."""

    def __init__(
        self,
        uri: str,
        *,
        timeout_s: float = 5.0,
        retries: int = 2,
        backoff_s: float = 0.2,
        transport: httpx.BaseTransport | None = None,
    ):
        self.uri = uri.rstrip("/")
        self.retries, self.backoff_s = retries, backoff_s
        self.http = httpx.Client(
            base_url=self.uri, timeout=timeout_s, transport=transport, trust_env=False
        )

    def close(self) -> None:
        self.http.close()

    # ------------------------------------------------------------------ transport
    def _call(
        self,
        method: str,
        path: str,
        *,
        json: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
        content: bytes | None = None,
    ) -> dict[str, Any]:
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                r = self.http.request(method, path, json=json, params=params, content=content)
            except httpx.HTTPError as exc:
                last = MlflowUnavailable(f"{self.uri}: {type(exc).__name__}: {exc}")
                continue
            if r.status_code >= 500 or r.status_code == 429:
                last = MlflowUnavailable(f"{self.uri}{path}: HTTP {r.status_code} {r.text[:300]}")
                continue
            if r.status_code >= 400:
                code, message = None, r.text[:500]
                try:
                    body = r.json()
                    code, message = body.get("error_code"), body.get("message", message)
                except ValueError:
                    pass
                raise MlflowRefused(
                    f"{path}: {code or r.status_code}: {message}", code, r.status_code
                )
            try:
                out = r.json() if r.content else {}
            except ValueError:
                out = {}
            return out if isinstance(out, dict) else {}
        assert last is not None
        raise last

    def _api(self, method: str, name: str, **kw: Any) -> dict[str, Any]:
        return self._call(method, f"/api/2.0/mlflow/{name}", **kw)

    # ------------------------------------------------------------------ experiments and runs
    def experiment_id(self, name: str) -> str:
        """The id of the experiment called `name`, created when there is none."""
        try:
            got = self._api("GET", "experiments/get-by-name", params={"experiment_name": name})
            return str(got["experiment"]["experiment_id"])
        except MlflowRefused as exc:
            if exc.code != "RESOURCE_DOES_NOT_EXIST":
                raise
        try:
            return str(
                self._api("POST", "experiments/create", json={"name": name})["experiment_id"]
            )
        except MlflowRefused as exc:  # created meanwhile by another daemon
            if exc.code != "RESOURCE_ALREADY_EXISTS":
                raise
            got = self._api("GET", "experiments/get-by-name", params={"experiment_name": name})
            return str(got["experiment"]["experiment_id"])

    def find_runs(self, experiment_id: str, tag: str, value: str) -> list[dict[str, Any]]:
        """Runs of the experiment whose tag `tag` is `value` (oldest first)."""
        quoted = value.replace("'", "\\'")
        got = self._api(
            "POST",
            "runs/search",
            json={
                "experiment_ids": [experiment_id],
                "filter": f"tags.`{tag}` = '{quoted}'",
                "run_view_type": "ALL",
                "max_results": 10,
                "order_by": ["attributes.start_time ASC"],
            },
        )
        return list(got.get("runs") or [])

    def create_run(
        self, experiment_id: str, name: str, start_ms: int, tags: Mapping[str, str]
    ) -> str:
        got = self._api(
            "POST",
            "runs/create",
            json={
                "experiment_id": experiment_id,
                "run_name": name,
                "start_time": start_ms,
                "tags": [{"key": k, "value": v} for k, v in tags.items()],
            },
        )
        return str(got["run"]["info"]["run_id"])

    def get_run(self, run_id: str) -> dict[str, Any]:
        return dict(self._api("GET", "runs/get", params={"run_id": run_id})["run"])

    def log_batch(
        self,
        run_id: str,
        *,
        metrics: Sequence[Mapping[str, Any]] = (),
        params: Mapping[str, str] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> None:
        """Metrics ({key, value, timestamp, step}), params and tags, split to MLflow's limits."""
        ms = list(metrics)
        ps = [{"key": k, "value": v[:MAX_PARAM_VALUE]} for k, v in (params or {}).items()]
        ts = [{"key": k, "value": v[:MAX_TAG_VALUE]} for k, v in (tags or {}).items()]
        while ms or ps or ts:
            body: dict[str, Any] = {"run_id": run_id}
            body["metrics"], ms = ms[:MAX_METRICS], ms[MAX_METRICS:]
            body["params"], ps = ps[:MAX_PARAMS], ps[MAX_PARAMS:]
            body["tags"], ts = ts[:MAX_TAGS], ts[MAX_TAGS:]
            self._api("POST", "runs/log-batch", json=body)

    def update_run(self, run_id: str, status: str, end_ms: int | None = None) -> None:
        body: dict[str, Any] = {"run_id": run_id, "status": status}
        if end_ms is not None:
            body["end_time"] = end_ms
        self._api("POST", "runs/update", json=body)

    def metric_history(self, run_id: str, key: str) -> list[dict[str, Any]]:
        got = self._api(
            "GET",
            "metrics/get-history",
            params={"run_id": run_id, "metric_key": key, "max_results": 25000},
        )
        return list(got.get("metrics") or [])

    # ------------------------------------------------------------------ artifacts
    def upload_artifact(self, run: Mapping[str, Any], path: str, data: bytes) -> None:
        """`data` as artifact `path` of the run, through the server's artifact proxy (the run's
        artifact_uri must be `mlflow-artifacts:/...`, the default of `mlflow server`)."""
        root = str(run["info"]["artifact_uri"])
        if not root.startswith("mlflow-artifacts:"):
            raise MlflowRefused(
                f"the run's artifact root {root} is not served by the tracking server "
                "(start it with --serve-artifacts, the default)"
            )
        rel = root.removeprefix("mlflow-artifacts:").lstrip("/")
        self._call(
            "PUT",
            f"/api/2.0/mlflow-artifacts/artifacts/{quote(rel)}/{quote(path)}",
            content=data,
        )

    def list_artifacts(self, run_id: str, path: str | None = None) -> list[dict[str, Any]]:
        params = {"run_id": run_id, **({"path": path} if path else {})}
        return list(self._api("GET", "artifacts/list", params=params).get("files") or [])
