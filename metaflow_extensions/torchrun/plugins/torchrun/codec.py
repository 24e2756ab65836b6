"""One codec for the package's records: a frozen dataclass is written to JSON and
read back from it field by field, each field checked by its type and bounds.

Why: a record crosses a trust boundary (a peer's gang message, a rank's answer)
and every field of it must be checked for its type and size; one reader that
takes both from the field's annotation replaces a hand-written pair per record.
Bounds ride on the type, ``Annotated[int, Int(0, MAX_CALL)]``:

- read (``decode``): a field absent or null takes its default (one without a
  default, or marked ``NEED``, is refused); bool is never an int; numbers are
  finite and within their bounds; texts, lists and dicts within their lengths;
  dicts keyed by int take decimal keys; enums by value; a nested record by its
  own fields and the outer record's error; ``Via`` is a field's hand code.
  A bad field raises the record's ``ERROR`` naming it.
- written (``encode``): enums as values, tuples as lists, int keys as text,
  nested records through their ``to_wire``; texts and lists cut to their bound
  and numbers clamped to theirs (nothing is sent that the reader refuses);
  ``SKIP`` fields are left off at their default, ``LOCAL`` ones always, and a
  ``DROP_NONE`` record leaves its nulls off; keys follow the fields' order,
  or ``WIRE_ORDER``.

Imports nothing of the package: the ranks read it too.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import typing
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Dict, Mapping, Optional, Tuple, Type, TypeVar, Union


@dataclass(frozen=True)
class Int:
    low: int
    high: int


@dataclass(frozen=True)
class Real:
    low: float = -math.inf
    high: float = math.inf
    digits: Optional[int] = None  # written rounded to this many decimals


@dataclass(frozen=True)
class Text:
    limit: int
    least: int = 0


@dataclass(frozen=True)
class OneOf:
    """A text (or a dict's key) that is one of these."""

    choices: Tuple[str, ...]


@dataclass(frozen=True)
class Items:
    """A list's or a dict's length."""

    limit: int


@dataclass(frozen=True)
class Hex:
    """Bytes as exactly ``size`` bytes of hex digits."""

    size: int


@dataclass(frozen=True)
class Via:
    """A field with logic of its own: ``read`` raises ``ValueError`` saying what is wrong."""

    read: Callable[[Any], Any]
    write: Optional[Callable[[Any], Any]] = None  # None: written by its type


class _Mark(enum.Enum):
    NEED = "on the wire even though it has a default"
    SKIP = "left off the wire at its default"
    LOCAL = "never on the wire"


NEED, SKIP, LOCAL = _Mark.NEED, _Mark.SKIP, _Mark.LOCAL
_NONE: Any = dataclasses.MISSING

R = TypeVar("R", bound="Record")


class Written:
    """A dataclass written by its fields' types."""

    DROP_NONE: ClassVar[bool] = False
    WIRE_ORDER: ClassVar[Tuple[str, ...]] = ()

    def to_wire(self) -> Dict[str, Any]:
        return encode(self)


class Record(Written):
    """A dataclass read and written by its fields' types."""

    ERROR: ClassVar[Type[Exception]] = ValueError

    @classmethod
    def from_wire(cls: Type[R], data: Any) -> R:
        return decode(cls, data)

    def problem(self) -> Optional[str]:
        """What is wrong across fields (each one checked already), or None."""
        return None


@dataclass(frozen=True)
class _Field:
    name: str
    kind: Any
    specs: Tuple[Any, ...]
    spec: dataclasses.Field

    def has_default(self) -> bool:
        return self.spec.default is not _NONE or self.spec.default_factory is not _NONE

    def default(self) -> Any:
        if self.spec.default_factory is not dataclasses.MISSING:
            return self.spec.default_factory()
        return self.spec.default


_FIELDS: Dict[type, Tuple[_Field, ...]] = {}


def _fields(cls: type) -> Tuple[_Field, ...]:
    found = _FIELDS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls, include_extras=True)
        found = tuple(_Field(f.name, *_split(hints[f.name]), f) for f in dataclasses.fields(cls))
        order = getattr(cls, "WIRE_ORDER", ())  # the JSON's key order, where it is not the fields'
        found = tuple(sorted(found, key=lambda f: order.index(f.name))) if order else found
        _FIELDS[cls] = found
    return found


def _split(kind: Any, specs: Tuple[Any, ...] = ()) -> Tuple[Any, Tuple[Any, ...]]:
    """The type without ``Annotated``, and its specs."""
    if typing.get_origin(kind) is typing.Annotated:
        return kind.__origin__, specs + tuple(kind.__metadata__)
    return kind, specs


def _spec(specs: Tuple[Any, ...], kind: Type[Any]) -> Any:
    return next((s for s in specs if isinstance(s, kind)), None)


def decode(cls: Type[R], data: Any, error: Optional[Type[Exception]] = None) -> R:
    """The record ``data`` holds, each field checked; ``error`` (the record's
    ``ERROR`` by default) names the first bad one."""
    error = error or cls.ERROR
    if not isinstance(data, Mapping):
        raise error("not an object (a %s)" % cls.__name__)
    values = {}
    for f in _fields(cls):
        value = data.get(f.name)
        if LOCAL in f.specs or value is None and f.has_default() and NEED not in f.specs:
            continue  # its default
        values[f.name] = _read(f.kind, f.specs, value, f.name, error)
    record = cls(**values)
    problem = record.problem()
    if problem:
        raise error(problem)
    return record


def _read(kind: Any, specs: Tuple[Any, ...], value: Any, name: str, error: Type[Exception]) -> Any:
    kind, specs = _split(kind, specs)
    via = _spec(specs, Via)
    if via is not None:
        try:
            return via.read(value)
        except ValueError as e:
            raise error("field %r: %s" % (name, e)) from None
    if typing.get_origin(kind) is Union:
        if value is None:
            return None
        inner = next(a for a in typing.get_args(kind) if a is not type(None))
        return _read(inner, specs, value, name, error)
    try:
        return _value(kind, specs, value, name, error)
    except _Bad as e:
        raise error("field %r: %s" % (name, e)) from None


class _Bad(Exception):
    pass


def _value(kind: Any, specs: Tuple[Any, ...], value: Any, name: str, error: Type[Exception]) -> Any:
    origin = typing.get_origin(kind)
    if origin in (tuple, list):
        return _items(kind, specs, value, name, error)
    if origin is dict:
        return _dict(kind, specs, value, name, error)
    if isinstance(kind, type) and issubclass(kind, Record):
        try:
            return decode(kind, value, error)
        except error as e:
            raise error("field %r: %s" % (name, e)) from None
    if hasattr(kind, "from_wire"):  # a record with a reader of its own
        return kind.from_wire(value)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        try:
            return kind(value)
        except ValueError:
            raise _Bad("not one of %s" % ", ".join(str(m.value) for m in kind)) from None
    return _scalar(kind, specs, value)


def _scalar(kind: Any, specs: Tuple[Any, ...], value: Any) -> Any:
    if kind is bool:
        if not isinstance(value, bool):
            raise _Bad("not a boolean")
        return value
    if kind is int:
        b = _spec(specs, Int)
        if isinstance(value, bool) or not isinstance(value, int) or not b.low <= value <= b.high:
            raise _Bad("not an integer in [%d, %d]" % (b.low, b.high))
        return value
    if kind is float:
        b = _spec(specs, Real) or Real()
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or isinstance(value, int) and abs(value) >= 2**53 or not math.isfinite(value) \
                or not b.low <= value <= b.high:
            raise _Bad("not a number in [%g, %g]" % (b.low, b.high))
        return float(value)
    if kind is str:
        return _text(specs, value)
    if kind is bytes:
        size = _spec(specs, Hex).size
        if not isinstance(value, str) or len(value) != 2 * size:
            raise _Bad("not %d hex digits" % (2 * size))
        try:
            return bytes.fromhex(value)
        except ValueError:
            raise _Bad("not hex") from None
    raise TypeError("codec: no reader for %r" % (kind,))


def _text(specs: Tuple[Any, ...], value: Any) -> str:
    one = _spec(specs, OneOf)
    if one is not None:
        if value not in one.choices:
            raise _Bad("not one of %s" % ", ".join(one.choices))
        return value
    b = _spec(specs, Text)
    if not isinstance(value, str) or not b.least <= len(value) <= b.limit:
        raise _Bad("not a string of %d to %d characters" % (b.least, b.limit))
    return value


def _items(kind: Any, specs: Tuple[Any, ...], value: Any, name: str, error: Type[Exception]) -> Any:
    limit = _spec(specs, Items).limit
    if not isinstance(value, list) or len(value) > limit:
        raise _Bad("not a list of at most %d" % limit)
    each = typing.get_args(kind)[0]
    return typing.get_origin(kind)(_read(each, (), v, name, error) for v in value)


def _dict(kind: Any, specs: Tuple[Any, ...], value: Any, name: str, error: Type[Exception]) -> Dict[Any, Any]:
    limit = _spec(specs, Items).limit
    if not isinstance(value, Mapping) or len(value) > limit:
        raise _Bad("not an object of at most %d entries" % limit)
    key_kind, item_kind = typing.get_args(kind)
    key_kind, key_specs = _split(key_kind)
    out = {}
    for key, item in value.items():
        if key_kind is int:
            try:
                key = int(key)
            except (TypeError, ValueError):
                raise _Bad("a key that is not a number") from None
        out[_scalar(key_kind, key_specs, key)] = _read(item_kind, (), item, name, error)
    return out


# -- writing --------------------------------------------------------------------------


def encode(record: Any) -> Dict[str, Any]:
    """The record's JSON object, its fields in their order."""
    out = {}
    for f in _fields(type(record)):
        value = getattr(record, f.name)
        if LOCAL in f.specs or SKIP in f.specs and value == f.default():
            continue
        wire = _write(f.kind, f.specs, value)
        if wire is not None or not getattr(record, "DROP_NONE", False):
            out[f.name] = wire
    return out


def _write(kind: Any, specs: Tuple[Any, ...], value: Any) -> Any:
    kind, specs = _split(kind, specs)
    via = _spec(specs, Via)
    if via is not None and via.write is not None:
        return via.write(value)
    if value is None or isinstance(value, (bool, int)):
        return value
    if typing.get_origin(kind) is Union:
        return _write(next(a for a in typing.get_args(kind) if a is not type(None)), specs, value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, float):
        b = _spec(specs, Real) or Real()
        value = min(max(value, b.low), b.high)
        return value if b.digits is None else round(value, b.digits)
    if isinstance(value, str):
        b = _spec(specs, Text)
        return value if b is None else value[:b.limit]
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (tuple, list)):
        each = typing.get_args(kind)[0] if typing.get_args(kind) else Any
        b = _spec(specs, Items)
        return [_write(each, (), v) for v in (value if b is None else value[:b.limit])]
    if isinstance(value, dict):
        return _write_dict(kind, specs, value)
    if hasattr(value, "to_wire"):
        return value.to_wire()
    return value


def _write_dict(kind: Any, specs: Tuple[Any, ...], value: Mapping[Any, Any]) -> Dict[Any, Any]:
    args = typing.get_args(kind) or (Any, Any)
    one = _spec(_split(args[0])[1], OneOf)
    b = _spec(specs, Items)
    pairs = [(k, v) for k, v in value.items() if one is None or k in one.choices]
    return {str(k) if isinstance(k, int) else k: _write(args[1], (), v)
            for k, v in (pairs if b is None else pairs[:b.limit])}
