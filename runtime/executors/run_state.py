"""Small JSON files beside an executor's runs (how far a run's log was copied, how it ended),
written atomically and updated under a file lock, so that any number of processes copying in
turn, a restarted daemon among them, agree on them."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from nightshift.runtime import locks
from nightshift.runtime.errors import OperatorError

M = TypeVar("M", bound=BaseModel)


class RunStateFiles(Generic[M]):
    """`<folder>/<name>.json` holding a `model`, one per run."""

    def __init__(self, folder: Path, model: type[M]):
        self.folder, self.model = folder, model

    def path(self, name: str) -> Path:
        return self.folder / f"{name}.json"

    @contextmanager
    def locked(self, name: str) -> Iterator[None]:
        self.folder.mkdir(parents=True, exist_ok=True)
        with locks.exclusive(self.folder / f"{name}.lock"):
            yield

    def read(self, name: str, default: Callable[[], M]) -> M:
        path = self.path(name)
        try:
            return self.model.model_validate_json(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return default()
        except ValidationError as exc:
            raise OperatorError(
                f"log copy state {str(path)!r} is unreadable ({exc.errors()[0]['msg']}); remove "
                "it and the run's output is copied again from the start"
            ) from exc

    def write(self, name: str, state: M) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.path(name)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(state.model_dump_json(), encoding="utf-8")
        os.replace(tmp, path)

    def update(self, name: str, read: Callable[[], M], **changes: Any) -> None:
        """Change some fields, under the run's lock; `read` reads the state as it stands."""
        with self.locked(name):
            self.write(name, read().model_copy(update=changes))
