"""`import pynvml` in a subprocess of a test (the real CLI): the fake of tests/fake_pynvml.py over
the GPUs in the JSON file $NIGHTSHIFT_TEST_NVML, written back after each change so that the next
command sees the limit the last one set. On PYTHONPATH only in the tests that ask for it."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fake_pynvml import fake_pynvml  # noqa: E402

_STATE = Path(os.environ["NIGHTSHIFT_TEST_NVML"])
_GPUS = json.loads(_STATE.read_text())
for _gpu in _GPUS:  # JSON keys are text; the fake looks these up by NVML's integer constants
    for _field in ("thresholds", "ecc", "retired"):
        if isinstance(_gpu.get(_field), dict):
            _gpu[_field] = {int(k): v for k, v in _gpu[_field].items()}


def _save() -> None:
    _STATE.write_text(json.dumps(_GPUS))


sys.modules[__name__] = fake_pynvml(_GPUS, on_change=_save)
