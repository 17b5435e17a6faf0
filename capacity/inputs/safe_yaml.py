"""The one YAML reader for what users give (scenario files, `--set` values, sweep grids, GPU profiles).

`yaml.safe_load` executes no tags, but it still expands anchors and aliases: a few hundred bytes of
nested aliases ("billion laughs") become billions of nodes once something walks the data (pydantic's
`model_dump()` does), and deep nesting overflows the recursion of the composer. So a document is
first scanned as a flat event stream (no recursion) for its nesting depth and number of aliases,
then composed, and the number of nodes it expands to is counted over the node graph (each node
once, memoised) before anything constructs Python objects. Every problem is a one-line
CapacityError naming the source (values quoted short: `capacity.util.text.quote`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from capacity.errors import CapacityError
from capacity.util.text import quote

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available: same result, faster

MAX_DEPTH = 50              # nested mappings/sequences (a scenario needs about 6)
MAX_ALIASES = 100           # `*alias` references in one document
MAX_NODES = 200_000         # nodes after expanding aliases (the shipped scenarios have a few hundred)
MAX_BYTES = 10 * 2**20      # a scenario or profile file


def _problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    at = f"line {mark.line + 1}: " if mark is not None else ""
    return at + quote(getattr(exc, "problem", None) or str(exc).splitlines()[0] or type(exc).__name__)


def _scan(text: str, source: str) -> None:
    """Depth and alias count from the event stream (iterative, so deep nesting cannot overflow)."""
    depth = aliases = 0
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise CapacityError(f"{source}: YAML nested more than {MAX_DEPTH} levels deep; flatten it "
                                    f"(a scenario needs a handful of levels)")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise CapacityError(f"{source}: YAML with more than {MAX_ALIASES} aliases (*name); write the "
                                    f"values out instead of referring to anchors")


def _count_nodes(root: yaml.Node, source: str) -> None:
    """Nodes the document expands to (aliases counted as often as they are used), memoised per node."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:   # depth <= MAX_DEPTH: recursion is bounded
        key = id(node)
        if key in sizes:
            if sizes[key] < 0:
                raise CapacityError(f"{source}: a YAML alias refers to the collection that holds it (a "
                                    f"recursive structure); write the values out")
            return sizes[key]
        sizes[key] = -1                 # being counted
        if isinstance(node, yaml.MappingNode):
            n = 1 + sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            n = 1 + sum(size(v) for v in node.value)
        else:
            n = 1
        sizes[key] = n
        return n

    total = size(root)
    if total > MAX_NODES:
        raise CapacityError(f"{source}: YAML expands to {total:,} values through its anchors and aliases (more "
                            f"than {MAX_NODES:,}); write the values out instead of nesting aliases")


def loads(text: str, source: str) -> Any:
    """One YAML document of user input -> Python values, within the bounds above; errors are one line."""
    if len(text) > MAX_BYTES:
        raise CapacityError(f"{source}: {len(text):,} characters of YAML (more than {MAX_BYTES:,}); give a smaller file")
    try:
        _scan(text, source)
        loader = _LOADER(text)
        try:
            root = loader.get_single_node()
            if root is None:
                return None
            _count_nodes(root, source)
            return loader.construct_document(root)
        finally:
            loader.dispose()
    except yaml.constructor.ConstructorError as exc:
        raise CapacityError(f"{source}: YAML tag not allowed ({_problem(exc)}); write plain values (numbers, "
                            f"text, lists, mappings)") from None
    except yaml.YAMLError as exc:
        raise CapacityError(f"{source}: not valid YAML ({_problem(exc)}); fix the syntax") from None
    except RecursionError:
        raise CapacityError(f"{source}: YAML nested too deeply; flatten it") from None


def read_text(path: str | Path, what: str = "file") -> str:
    """A user file's text (UTF-8, at most MAX_BYTES); a missing, unreadable or non-UTF-8 file is one line."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise CapacityError(f"{_name(path, what)}: {size:,} bytes (more than {MAX_BYTES:,}); give a smaller file")
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CapacityError(f"{_name(path, what)}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except OSError as exc:
        raise CapacityError(f"{_name(path, what)}: cannot read it ({exc.strerror or exc}); check the path") from None


def load_file(path: str | Path, what: str = "file") -> Any:
    """A user YAML file -> Python values (see `loads`)."""
    return loads(read_text(path, what), _name(Path(path), what))


def _name(path: Path, what: str) -> str:
    return str(path) if what == "file" else f"{what} {path}"
