"""What a JSON schema may ask of the server, checked in Python before any of it reaches native code.

llguidance compiles a schema by recursing through it, `$ref`s included: a chain of 1,500 references overflows the
native stack and kills the process, and an object of 8,000 optional properties costs seconds to compile and then
fails in the worker's parser ("Current row has 2407 items; max is 2000") after the job waited its turn. These
bounds keep every schema within what the checker and the worker's parser can run; each refusal names the bound and
where in the schema it was met. The bounds are OpenAI's where it states one (5,000 properties in all), and the
parser's otherwise (its rows hold about four items per optional property of an object, at most 2,000).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tasks.errors import InvalidRequest

#: keywords whose value is one schema
ONE: tuple[str, ...] = (
    "items",
    "additionalProperties",
    "additionalItems",
    "unevaluatedProperties",
    "unevaluatedItems",
    "not",
)
ONE += ("if", "then", "else", "contains", "propertyNames")
#: keywords whose value is a list of schemas
MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
#: keywords whose value maps names to schemas that are part of the instance
NAMED = ("properties", "patternProperties", "dependentSchemas")
DEFINITIONS = ("$defs", "definitions")
YIELD_EVERY = 1_000  # schemas walked between two turns of the web's other requests


@dataclass(frozen=True)
class SchemaLimits:
    """The bounds; docs/api.md ("Structured output") lists them."""

    bytes: int = 64 * 1024  # one schema, as compact JSON
    tools_bytes: int = 256 * 1024  # all of a request's tools' schemas
    depth: int = 64  # levels of subschemas on any path, each `$ref` followed (a recursive one counts once)
    properties: int = 400  # listed by one object
    all_properties: int = 5_000  # in the whole schema (OpenAI's bound)
    enum: int = 1_000  # values of one `enum`
    branches: int = 128  # schemas of one `anyOf` / `oneOf` / `allOf`
    definitions: int = 512  # `$defs` and `definitions`
    refs: int = 2_048  # `$ref`s
    schemas: int = 20_000  # subschemas in all


LIMITS = SchemaLimits()


def check_schema(schema: Any, param: str, limits: SchemaLimits = LIMITS) -> None:
    """InvalidRequest naming the bound `schema` passes, and where; nothing if it is within them all."""
    counts = {"properties": 0, "definitions": 0, "refs": 0, "schemas": 0}
    for path, node in _subschemas(schema):  # (first: a wide object is refused at its first node)
        counts["schemas"] += 1
        if counts["schemas"] > limits.schemas:
            _refuse(param, f"has more than {limits.schemas:,} subschemas")
        _check_node(node, path, counts, param, limits)
    size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())
    if size > limits.bytes:
        _refuse(param, f"is {size:,} bytes of JSON; at most {limits.bytes:,}")
    depth = _depth(schema)
    if depth > limits.depth:
        _refuse(param, f"nests {depth:,} levels deep once its $refs are followed; at most {limits.depth}")


def _check_node(node: dict[str, Any], path: str, counts: dict[str, int], param: str, limits: SchemaLimits) -> None:
    props = node.get("properties")
    if isinstance(props, dict):
        if len(props) > limits.properties:
            _refuse(param, f"lists {len(props):,} properties in one object ({path}); at most {limits.properties}")
        counts["properties"] += len(props)
        if counts["properties"] > limits.all_properties:
            _refuse(param, f"lists more than {limits.all_properties:,} properties in all")
    enum = node.get("enum")
    if isinstance(enum, list) and len(enum) > limits.enum:
        _refuse(param, f"has an enum of {len(enum):,} values ({path}); at most {limits.enum:,}")
    for key in ("anyOf", "oneOf", "allOf"):
        branches = node.get(key)
        if isinstance(branches, list) and len(branches) > limits.branches:
            _refuse(param, f"has {len(branches):,} schemas in one {key} ({path}); at most {limits.branches}")
    for key in DEFINITIONS:
        if isinstance(node.get(key), dict):
            counts["definitions"] += len(node[key])
    if counts["definitions"] > limits.definitions:
        _refuse(param, f"has more than {limits.definitions} definitions ($defs)")
    if isinstance(node.get("$ref"), str):
        counts["refs"] += 1
        if counts["refs"] > limits.refs:
            _refuse(param, f"has more than {limits.refs:,} $refs")


def _refuse(param: str, why: str) -> None:
    raise InvalidRequest(f"the JSON schema {why}", param=param)


def _children(node: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(where, schema) of each schema written inside `node`, definitions included."""
    for key in ONE:
        if key in node:
            yield key, node[key]
    for key in MANY:
        if isinstance(node.get(key), list):
            yield from ((f"{key}/{i}", s) for i, s in enumerate(node[key]))
    for key in (*NAMED, *DEFINITIONS):
        if isinstance(node.get(key), dict):
            yield from ((f"{key}/{name}", s) for name, s in node[key].items())
    if isinstance(node.get("items"), list):  # (draft 4's tuple form)
        yield from ((f"items/{i}", s) for i, s in enumerate(node["items"]))


def _subschemas(schema: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema object in `schema` with its JSON pointer, without recursion (the body is nested 32 deep at
    most, but a schema's own walk must not be the thing that overflows)."""
    stack: list[tuple[str, Any]] = [("#", schema)]
    seen = 0
    while stack:
        path, node = stack.pop()
        seen += 1
        if seen % YIELD_EVERY == 0:
            time.sleep(0)  # under gevent (onelane web), the process's other requests run meanwhile
        if isinstance(node, dict):
            yield path, node
            stack.extend((f"{path}/{where}", child) for where, child in _children(node))


def _resolve(root: Any, ref: str) -> Any:
    """The schema a local `$ref` ("#", "#/$defs/a") points at, or None (a remote or broken one: llguidance names it)."""
    if not ref.startswith("#"):
        return None
    node = root
    for part in filter(None, ref[1:].split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node if isinstance(node, dict) else None


def _depth(root: Any) -> int:
    """The most levels on any path from `root` through its subschemas and `$ref`s, a path ending where it meets a
    schema it is already inside (recursion, which the grammar keeps as a rule instead of unrolling it)."""
    if not isinstance(root, dict):
        return 0
    done: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[dict[str, Any], bool]] = [(root, False)]
    popped = 0
    while stack:
        node, expanded = stack.pop()
        key = id(node)
        popped += 1
        if popped % YIELD_EVERY == 0:
            time.sleep(0)
        if expanded:
            on_path.discard(key)
            done[key] = 1 + max((done.get(id(c), 0) for c in _next(root, node)), default=0)
            continue
        if key in done or key in on_path:
            continue
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _next(root, node) if id(c) not in done and id(c) not in on_path)
    return done[id(root)]


def _next(root: Any, node: dict[str, Any]) -> list[dict[str, Any]]:
    """The schemas one level below `node` in an instance: its own subschemas (not its definitions, which are only
    reached through a $ref) and what its $ref points at."""
    out = [c for where, c in _children(node) if isinstance(c, dict) and not where.startswith(DEFINITIONS)]
    ref = node.get("$ref")
    if isinstance(ref, str) and (target := _resolve(root, ref)) is not None:
        out.append(target)
    return out
