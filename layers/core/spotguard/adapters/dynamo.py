"""DynamoDB on the low-level client, for the ledger's two adapters (ledger.py, job_store.py).

- `marshal` / `plain`: items, keys and expression values as plain Python values, turned into DynamoDB's
  typed maps by boto3's TypeSerializer and back by its TypeDeserializer: str <-> S, int <-> N (read back
  as Decimal), bool <-> BOOL, None <-> NULL, list <-> L. This is the layout the tables have always held,
  so items written before and after read the same. A float is refused: ledger numbers are ints.
- `conditional` / `written` / `refusal`: a conditional write (PutItem, UpdateItem) whose failed
  condition is an answer, not an error; any other error is raised (botocore's standard retry mode has
  retried what it could).

The low-level client (not the Table resource) is kept on purpose: tests and benchmarks count its
operations through botocore's event hooks, and it is the client every other adapter uses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

_SERIALIZER = TypeSerializer()
_DESERIALIZER = TypeDeserializer()


def marshal(values: Mapping[str, Any]) -> dict[str, Any]:
    """An item, a key or ExpressionAttributeValues: {name: plain value} -> {name: {type: value}}."""
    return {name: _SERIALIZER.serialize(value) for name, value in values.items()}


def key(pk: str, sk: str) -> dict[str, Any]:
    """The table's key (every item is keyed pk/sk, both strings)."""
    return marshal({"pk": pk, "sk": sk})


def plain(item: Mapping[str, Any] | None) -> dict[str, Any]:
    """An item read back as plain values; {} for no item."""
    return {name: _DESERIALIZER.deserialize(value) for name, value in (item or {}).items()}


def conditional_failed(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"


def conditional(write: Callable[..., Any], /, **request: Any) -> tuple[bool, dict[str, Any]]:
    """Run a conditional write, `write(**request)` (e.g. `client.update_item`). (True, the attributes
    the write returned, as plain values: those its ReturnValues asked for) when it went in; (False, the
    item that stood in the way: empty unless the request asked ReturnValuesOnConditionCheckFailure=
    "ALL_OLD" and one stood) when its condition did not hold and nothing changed."""
    try:
        answer = write(**request)
    except ClientError as exc:
        if not conditional_failed(exc):
            raise
        return False, plain(exc.response.get("Item"))
    return True, plain((answer or {}).get("Attributes"))


def refusal(write: Callable[..., object], /, **request: Any) -> dict[str, Any] | None:
    """A conditional write. None: it went in; otherwise the item that stood in the way (see
    `conditional`)."""
    went_in, item = conditional(write, **request)
    return None if went_in else item


def written(write: Callable[..., object], /, **request: Any) -> bool:
    """Run a conditional write: True when it went in, False when its condition did not hold."""
    return refusal(write, **request) is None
