#!/usr/bin/env bash
# CI: the MLflow tracking server for the mirror's tests (tests/test_mlflow_mirror.py starts and
# stops its own on 127.0.0.1), in a venv of its own: the full `mlflow` package pins sqlalchemy,
# alembic, pandas, pyarrow, flask, ... which must not change nightshift's environment. The tests
# find it at /opt/nightshift-mlflow/bin/mlflow (or NIGHTSHIFT_TEST_MLFLOW). psycopg2 for the test
# that puts MLflow's backend store on PostgreSQL. 3.17.2: the newest that resolves (3.18.0 needs
# an mlflow-tracing 3.18.0 that is not published). Idempotent.
set -euo pipefail
VENV=${NIGHTSHIFT_MLFLOW_VENV:-/opt/nightshift-mlflow}
VERSION=3.17.2

if ! "$VENV/bin/mlflow" --version 2>/dev/null | grep -q "$VERSION"; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "mlflow==$VERSION" "psycopg2-binary>=2.9"
fi
"$VENV/bin/mlflow" --version
