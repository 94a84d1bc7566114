"""Load YAML into a pydantic model with errors that name the field *and* the line it is on.

User files are untrusted: they are read as bytes within a size limit, decoded as strict UTF-8,
parsed by a loader that refuses aliases (an alias bomb expands a few lines into gigabytes), and
bounded in depth and string length before any model sees them. Data that arrives as a mapping
(the API, a goal's inline spec) passes the same bounds through `check_bounds`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from nightshift.runtime.errors import SpecError

M = TypeVar("M", bound=BaseModel)

# A spec, goal or policy is a page of YAML; 1 MiB is a hundred times a large one.
MAX_FILE_BYTES = 1 << 20
# Real files nest a handful of levels; 64 stays far from Python's recursion limit (json, pydantic).
MAX_DEPTH = 64
# A command item, regex or path is short; 64 KiB leaves room for an inline JSON argument.
MAX_STRING = 64 << 10
# Scalars, items and keys in one document: bounds the work of validating a mapping.
MAX_NODES = 200_000


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and bounds nesting depth and scalar length as it composes."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None,
                None,
                f"aliases (*{event.anchor}) are not allowed: write the value out",
                event.start_mark,
            )
        mark = self.peek_event().start_mark
        self._depth += 1
        self._nodes += 1
        if self._depth > MAX_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested deeper than {MAX_DEPTH} levels", mark
            )
        if self._nodes > MAX_NODES:
            raise yaml.composer.ComposerError(
                None, None, f"more than {MAX_NODES} values in one file", mark
            )
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, yaml.ScalarNode) and len(node.value) > MAX_STRING:
            raise yaml.composer.ComposerError(
                None, None, f"a string longer than {MAX_STRING} characters", node.start_mark
            )
        return node


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


def read_text(path: str | Path) -> str:
    """A user file's text: at most MAX_FILE_BYTES, strict UTF-8; SpecError otherwise."""
    p = Path(path)
    try:
        found = "\x00" not in str(p) and p.exists()
    except OSError as exc:  # a name too long, a folder we may not enter
        raise SpecError(f"cannot be read ({exc.strerror or exc})", path=str(p)) from None
    if not found:
        raise SpecError("file not found; check the path", path=str(p))
    if not p.is_file():
        raise SpecError("not a regular file; give the path of a YAML file", path=str(p))
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise SpecError(f"cannot be read ({exc.strerror or exc})", path=str(p)) from exc
    if len(raw) > MAX_FILE_BYTES:
        raise SpecError(
            f"larger than {MAX_FILE_BYTES // 1024} KiB; a spec or goal is a page of YAML "
            "(keep data sets and weights in files it names)",
            path=str(p),
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"not UTF-8 text (byte {exc.start}: {raw[exc.start : exc.start + 1]!r}); "
            "save the file as UTF-8",
            path=str(p),
            line=raw[: exc.start].count(b"\n") + 1,
        ) from None


def parse_yaml(text: str, path: str) -> tuple[Any, yaml.Node | None]:
    """The data and its node tree (for line numbers), composed once by the bounded loader."""
    loader: _BoundedLoader | None = None
    try:
        loader = _BoundedLoader(text)  # its reader refuses control characters at once
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise SpecError(
            f"not valid YAML: {getattr(exc, 'problem', None) or exc}",
            path=path,
            line=mark.line + 1 if mark else None,
        ) from None
    except RecursionError:
        raise SpecError(f"nested deeper than {MAX_DEPTH} levels", path=path) from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, node


def read_yaml(path: str | Path) -> tuple[Any, yaml.Node | None, str]:
    text = read_text(path)
    data, node = parse_yaml(text, str(path))
    return data, node, text


def check_bounds(data: Any, *, path: str | None = None, field: str | None = None) -> None:
    """Refuse data nested deeper than MAX_DEPTH, with a string longer than MAX_STRING or more
    than MAX_NODES values (what a file's loader bounds, for data that arrives as a mapping)."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    seen = 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if depth > MAX_DEPTH:
            raise SpecError(f"nested deeper than {MAX_DEPTH} levels", path=path, field=field)
        if seen > MAX_NODES:
            raise SpecError(f"more than {MAX_NODES} values", path=path, field=field)
        if isinstance(value, str):
            if len(value) > MAX_STRING:
                raise SpecError(
                    f"a string longer than {MAX_STRING} characters", path=path, field=field
                )
        elif isinstance(value, dict):
            stack.extend((k, depth + 1) for k in value)
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list | tuple):
            stack.extend((v, depth + 1) for v in value)


def validate(
    model: type[M],
    data: Any,
    *,
    path: str | None = None,
    node: yaml.Node | None = None,
    loc_prefix: tuple[Any, ...] = (),
) -> M:
    """Validate `data`; on failure raise SpecError for the first error, naming its field and line."""
    check_bounds(data, path=path, field=".".join(map(str, loc_prefix)) or None)
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
