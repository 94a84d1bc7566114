"""Load YAML into a pydantic model with errors that name the field *and* the line it is on.

User files are untrusted: they are read as bytes within a size limit, decoded as strict UTF-8,
parsed by a loader that refuses aliases (an alias bomb expands a few lines into gigabytes), and
bounded in depth, string length and integer size before any model sees them, so that nothing
later recurses past Python's limit (json, pydantic, the audit) or converts a 5,000-digit integer
(Python refuses past 4,300 digits). Data that arrives as a mapping (the API, a goal's inline spec,
the gate's arguments) passes the same bounds through `check_bounds` / `bounds_problem`; each
refusal names the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from nightshift.runtime.errors import SpecError
from nightshift.runtime.user_files import read_as_reader

M = TypeVar("M", bound=BaseModel)

# A spec, goal or policy is a page of YAML; 1 MiB is a hundred times a large one.
MAX_FILE_BYTES = 1 << 20
# Real files nest a handful of levels; 64 stays far from Python's recursion limit (json, pydantic).
MAX_DEPTH = 64
# A command item, regex or path is short; 64 KiB leaves room for an inline JSON argument.
MAX_STRING = 64 << 10
# Scalars, items and keys in one document: bounds the work of validating a mapping.
MAX_NODES = 200_000
# No setting needs a longer integer (a seed has 19 digits); Python refuses to convert past 4,300.
MAX_INT_DIGITS = 100
_INT_LIMIT = 10**MAX_INT_DIGITS
_INT_TAG = "tag:yaml.org,2002:int"
# How much of a refused value's field path a message shows.
_SHOWN_PARTS = 8


class _Refused(yaml.YAMLError):
    """A value the loader refuses, at its line and field."""

    def __init__(self, problem: str, mark: Any, field: str | None):
        self.problem, self.problem_mark, self.field = problem, mark, field
        super().__init__(problem)


def field_path(parts: list[Any]) -> str | None:
    """`a.b[2].c`, cut after _SHOWN_PARTS parts (a refusal for depth is deep by definition)."""
    out = ""
    for part in parts[:_SHOWN_PARTS]:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    if len(parts) > _SHOWN_PARTS:
        out += "..."
    return out or None


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and bounds nesting depth and scalar length as it composes."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0
        self._path: list[Any] = []  # the field being composed: keys and item indexes

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
        # A mapping's value is composed with its key node as `index`, an item with its number.
        self._path.append(
            index.value
            if isinstance(index, yaml.ScalarNode)
            else (index if isinstance(index, int) else None)
        )
        try:
            if self._depth > MAX_DEPTH:
                raise self._refused(f"nested deeper than {MAX_DEPTH} levels (the limit)", mark)
            if self._nodes > MAX_NODES:
                raise self._refused(f"more than {MAX_NODES} values in one file (the limit)", mark)
            node = super().compose_node(parent, index)
            if isinstance(node, yaml.ScalarNode):
                if len(node.value) > MAX_STRING:
                    raise self._refused(
                        f"a string longer than {MAX_STRING} characters (the limit)",
                        node.start_mark,
                    )
                if node.tag == _INT_TAG and _digits(node.value) > MAX_INT_DIGITS:
                    raise self._refused(_too_long_int(), node.start_mark)
        finally:
            self._depth -= 1
            self._path.pop()
        return node

    def _refused(self, problem: str, mark: Any) -> _Refused:
        return _Refused(problem, mark, field_path([p for p in self._path if p is not None]))

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """A value that cannot be made (a date such as 2024-13-45) is a YAML error at its line."""
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as exc:
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read this value: {exc}", node.start_mark
            ) from None


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
    """A user file's text: at most MAX_FILE_BYTES, strict UTF-8; SpecError otherwise. Read as
    the caller of the daemon's socket where there is one (runtime/user_files.py)."""
    p = Path(path)
    try:
        raw = read_as_reader(p, MAX_FILE_BYTES)
    except OSError as exc:
        raise SpecError(f"cannot be read: {exc}", path=str(p)) from None
    if raw is not None:
        return _decoded(raw, p)
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
    return _decoded(raw, p)


def _decoded(raw: bytes, p: Path) -> str:
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
    except _Refused as exc:
        raise SpecError(
            exc.problem, path=path, field=exc.field, line=exc.problem_mark.line + 1
        ) from None
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
    """Refuse data nested deeper than MAX_DEPTH, with a string longer than MAX_STRING, an
    integer longer than MAX_INT_DIGITS or more than MAX_NODES values (what a file's loader
    bounds, for data that arrives as a mapping): SpecError naming the field under `field`."""
    found = bounds_problem(data)
    if found is not None:
        where, problem = found
        joined = ".".join(p for p in (field, where) if p).replace(".[", "[") or None
        raise SpecError(problem, path=path, field=joined)


def bounds_problem(data: Any, max_depth: int = MAX_DEPTH) -> tuple[str | None, str] | None:
    """The first value out of bounds, as (its field path, what is wrong with it and the limit),
    or None. Iterative: it never recurses, however deep the data."""
    # Each entry: the value, its depth, and where it is as (where its container is, key).
    stack: list[tuple[Any, int, Any]] = [(data, 0, None)]
    seen = 0
    while stack:
        value, depth, at = stack.pop()
        seen += 1
        problem = None
        if depth > max_depth:
            problem = f"nested deeper than {max_depth} levels (the limit)"
        elif seen > MAX_NODES:
            problem = f"more than {MAX_NODES} values (the limit)"
        elif isinstance(value, str) and len(value) > MAX_STRING:
            problem = f"a string longer than {MAX_STRING} characters (the limit)"
        elif isinstance(value, str) and not value.isascii() and _lone_surrogate(value):
            problem = (
                "text with a lone surrogate escape (such as \\ud800), which is no character: "
                "write the character itself"
            )
        elif isinstance(value, int) and abs(value) >= _INT_LIMIT:
            problem = _too_long_int()
        elif isinstance(value, dict):
            for k, v in value.items():
                stack.append((k, depth + 1, at))
                stack.append((v, depth + 1, (at, k)))
        elif isinstance(value, list | tuple):
            stack.extend((v, depth + 1, (at, i)) for i, v in enumerate(value))
        if problem is not None:
            parts: list[Any] = []
            while at is not None:
                at, key = at
                parts.append(key)
            return field_path(parts[::-1]), problem
    return None


def _lone_surrogate(text: str) -> bool:
    """Whether `text` holds a surrogate code point (YAML's "\\ud800" makes one), which no
    encoder takes: the validator and the store would fail on it with a UnicodeEncodeError."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _digits(text: str) -> int:
    """How long an integer YAML writes as `text` is (its sign and `_` separators aside)."""
    return len(text) - sum(text.count(c) for c in "+-_")


def _too_long_int() -> str:
    return (
        f"an integer longer than {MAX_INT_DIGITS} digits (the limit): no setting needs one; "
        "write a float (1e300) or a string if the program wants such a number"
    )


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
