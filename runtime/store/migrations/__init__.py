"""The store's schema history as Alembic revisions; `nightshift.runtime.store.db` applies them.

HEAD names the newest revision so that opening an up-to-date store compares one string and
never loads Alembic; a test checks it against the revision files.
"""

from pathlib import Path

HEAD = "0022_hold_tail"
BASELINE = "0001_baseline"  # the schema of release 0.1.0, the last one before Alembic
SCRIPT_LOCATION = str(Path(__file__).resolve().parent)
