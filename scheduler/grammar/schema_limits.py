"""How large a JSON schema a request may constrain its output with, checked before anything compiles it.

A grammar's compile time grows with its schema (measured here: an enum of 20,000 strings took 0.9-20 s
to compile, objects nested 200 deep 2.5 s before compiling even began), so a schema is measured first, by
an iterative walk (a schema nested deeper than the interpreter's recursion limit is measured like any
other), and refused with what it exceeded. The limits follow OpenAI's published ones for structured
outputs where it has them, so a schema OpenAI accepts is accepted here; the compile budget
(`scheduler.grammar.worker`) bounds what gets past them.
"""

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SchemaLimits:
    max_depth: int = 32  # JSON nesting of the schema document (an object property costs two levels)
    max_properties: int = 5000  # object properties, over the whole schema
    max_enum_values: int = 1000  # enum values and consts, over the whole schema
    max_string_chars: int = 120_000  # property names, enum values and consts, in characters, together
    max_bytes: int = 256 * 1024  # the schema as compact JSON text


LIMITS = SchemaLimits()


class SchemaTooComplex(ValueError):
    """A schema past one of the limits; the message says which, and by how much."""


def check_schema(schema: Any, limits: SchemaLimits = LIMITS) -> None:
    """SchemaTooComplex if `schema` exceeds any of `limits` (its depth is checked before anything that
    recurses touches it)."""
    properties = enums = chars = 0
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limits.max_depth:
            raise SchemaTooComplex(f"nests deeper than {limits.max_depth} levels")
        if isinstance(node, dict):
            named = node.get("properties")
            if isinstance(named, dict):
                properties += len(named)
                chars += sum(len(str(name)) for name in named)
            listed = node.get("enum")
            values = (listed if isinstance(listed, list) else []) + ([node["const"]] if "const" in node else [])
            enums += len(values)
            chars += sum(len(v) for v in values if isinstance(v, str))
            stack.extend((child, depth + 1) for child in node.values() if isinstance(child, dict | list))
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node if isinstance(child, dict | list))
        if properties > limits.max_properties:
            raise SchemaTooComplex(f"has more than {limits.max_properties} object properties")
        if enums > limits.max_enum_values:
            raise SchemaTooComplex(f"has more than {limits.max_enum_values} enum values")
        if chars > limits.max_string_chars:
            raise SchemaTooComplex(f"has more than {limits.max_string_chars} characters of property names "
                                   "and enum values")
    size = len(json.dumps(schema, separators=(",", ":")))
    if size > limits.max_bytes:
        raise SchemaTooComplex(f"is {size} bytes as JSON; at most {limits.max_bytes} are allowed")
