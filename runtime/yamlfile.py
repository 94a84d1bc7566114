"""Load YAML into a pydantic model with errors that name the field *and* the line it is on."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from nightshift.runtime.errors import SpecError

M = TypeVar("M", bound=BaseModel)


def line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """Walk a composed YAML node tree along a pydantic error location; return a 1-based line."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == str(part):
                    node, line = v, k.start_mark.line + 1
                    break
            else:
                return line
        elif (
            isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value)
        ):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def read_yaml(path: str | Path) -> tuple[Any, yaml.Node | None, str]:
    p = Path(path)
    if not p.exists():
        raise SpecError("file not found; check the path", path=str(p))
    text = p.read_text()
    try:
        return yaml.safe_load(text), yaml.compose(text), text
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise SpecError(
            f"not valid YAML: {getattr(exc, 'problem', exc)}",
            path=str(p),
            line=mark.line + 1 if mark else None,
        ) from exc


def validate(
    model: type[M],
    data: Any,
    *,
    path: str | None = None,
    node: yaml.Node | None = None,
    loc_prefix: tuple[Any, ...] = (),
) -> M:
    """Validate `data`; on failure raise SpecError for the first error, naming its field and line."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        field = ".".join(str(p) for p in loc_prefix + loc) or None
        more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise SpecError(
            f"{err['msg']}{more}", path=path, field=field, line=line_of(node, loc_prefix + loc)
        ) from exc


def load_model(model: type[M], path: str | Path) -> M:
    return load_model_text(model, path)[0]


def load_model_text(model: type[M], path: str | Path) -> tuple[M, str]:
    """The validated model and the text it was read from (to hash what was checked)."""
    data, node, text = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError("expected a mapping at the top level", path=str(path), line=1)
    return validate(model, data, path=str(path), node=node), text
