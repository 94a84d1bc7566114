"""A stand-in for `nvidia-smi` on a machine without GPUs: answers the two queries the probe makes
(field by field, as nvidia-smi does) and the default table (whose header has the CUDA version)
from the real H100 capture in tests/fixtures/nvidia_smi, or, when the state file says `lost`, as
nvidia-smi does for a GPU that fell off the bus.

Usage (through a wrapper script named nvidia-smi): fake_nvidia_smi.py STATE_FILE ARGS...
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

CAPTURES = Path(__file__).parent / "fixtures" / "nvidia_smi"
LOST = (
    "Unable to determine the device handle for GPU0000:00:09.0: GPU is lost. "
    "Reboot the system to recover this GPU\n"
)


def main(argv: list[str]) -> int:
    state = Path(argv[0]).read_text().strip() if Path(argv[0]).exists() else "ok"
    query = argv[1] if len(argv) > 1 else ""
    if state == "lost":
        sys.stdout.write(LOST)
        return 15
    if not query:  # the default table, whose header has the driver and CUDA versions
        sys.stdout.write((CAPTURES / "h100_80gb_load_table.txt").read_text())
        return 0
    if query.startswith("--query-compute-apps="):
        sys.stdout.write((CAPTURES / "h100_80gb_load_query_compute_apps.csv").read_text())
        return 0
    if not query.startswith("--query-gpu="):
        sys.stderr.write(f"fake nvidia-smi: unsupported arguments {argv[1:]}\n")
        return 2
    rows = list(
        csv.reader(
            io.StringIO((CAPTURES / "h100_80gb_load_query_gpu.csv").read_text()),
            skipinitialspace=True,
        )
    )
    cells = {h.split("[")[0].strip(): (h, v) for h, v in zip(rows[0], rows[1], strict=True)}
    fields = query.split("=", 1)[1].split(",")
    header = [cells.get(f, (f, ""))[0] for f in fields]
    values = [cells.get(f, (f, "[N/A]"))[1] for f in fields]
    sys.stdout.write(", ".join(header) + "\n" + ", ".join(values) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
