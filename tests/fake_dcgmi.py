"""A stand-in `dcgmi` for tests: installs an executable named dcgmi in a folder (put it first on
PATH) that records its argv and prints a recorded `dcgmi diag` table from tests/fixtures/dcgmi
(the fixture's "# " header, which names its source, left out), exiting with the code given."""

from __future__ import annotations

import json
import sys
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "dcgmi"


def install(folder: Path, fixture: str, *, exit_code: int = 0, sleep_s: float = 0.0) -> Path:
    """An executable `folder/dcgmi` printing `fixture`; its calls go to `folder/calls.jsonl`."""
    folder.mkdir(parents=True, exist_ok=True)
    table = "".join(
        line
        for line in (FIXTURES / fixture).read_text().splitlines(True)
        if not line.startswith("# ")
    )
    (folder / "table.txt").write_text(table)
    exe = folder / "dcgmi"
    exe.write_text(
        f"#!{sys.executable}\n"
        "import json, sys, time\n"
        f"open({str(folder / 'calls.jsonl')!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"time.sleep({sleep_s!r})\n"
        f"sys.stdout.write(open({str(folder / 'table.txt')!r}).read())\n"
        f"sys.exit({exit_code!r})\n"
    )
    exe.chmod(0o755)
    return exe


def calls(folder: Path) -> list[list[str]]:
    path = folder / "calls.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]
