"""Schemas are measured before anything compiles them: too deep (deeper than the interpreter's recursion
limit too), too many properties, enum values or characters, too large; each refused with what it exceeded,
and through the API with the field named. A real server over the fake engine for the API cases."""

import json

import pytest
import pytest_asyncio
from support.fake_call import fake_server, http_post

from scheduler.grammar.constraint import Grammar
from scheduler.grammar.schema_limits import LIMITS, SchemaTooComplex, check_schema
from voicepipe.call.limits import Limits


def nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


@pytest.mark.parametrize("schema, said", [
    (nested(5000), "nests deeper than 32"),  # far past the recursion limit: measured all the same
    (nested(200), "nests deeper than 32"),
    ({"enum": [f"s{i:05d}" for i in range(20_000)]}, "more than 1000 enum values"),
    ({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(5001)}}, "more than 5000 object"),
    ({"anyOf": [{"enum": ["x" * 1000] * 100} for _ in range(2)]}, "more than 120000 characters"),
    ({"type": "object", "properties": {"a": {"type": "string", "description": "x" * 300_000}}}, "bytes as JSON"),
])
def test_a_schema_past_a_limit_is_refused_saying_which(schema, said):
    with pytest.raises(SchemaTooComplex, match=said):
        check_schema(schema)
    with pytest.raises(SchemaTooComplex):
        Grammar.json_schema(schema)


def test_schemas_within_the_limits_pass():
    check_schema(nested(15))  # two levels of the document per object
    check_schema({"enum": [f"value {i}" for i in range(LIMITS.max_enum_values)]})
    check_schema({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(2000)}})


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server():
    async with fake_server(Limits(max_body_bytes=1 << 20)) as (server, _):
        yield server


def chat(**extra) -> dict:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "Hello?"}], **extra}


def tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "deep", "schema": nested(200)}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "many", "schema": {
        "type": "object", "properties": {"x": {"enum": [f"s{i:05d}" for i in range(20_000)]}}}}}},
     "response_format.json_schema.schema"),
    ({"tools": [tool("fine", {"type": "object"}), tool("deep", nested(200))]}, "tools[1].function.parameters"),
    ({"tools": [tool(f"f{i}", {"type": "object"}) for i in range(129)]}, "tools"),
])
@pytest.mark.asyncio(loop_scope="module")
async def test_the_api_refuses_a_schema_past_the_limits_naming_the_field(server, extra, param):
    status, _, payload = await http_post(server, chat(**extra))
    error = json.loads(payload)["error"]
    assert status == 400 and error["param"] == param and error["code"] == "schema_too_complex", error
