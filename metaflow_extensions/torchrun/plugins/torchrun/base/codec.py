"""One codec for the package's records: a frozen dataclass written to JSON and read
back field by field, each checked by the type and bounds its annotation gives
(``Annotated[int, Int(0, MAX_CALL)]``), with no hand-written pair per record. Absent
or null reads as the default; the other rules are docs/design.md's (the module map).
Written: only what the reader takes (cut, clamped), keys in the fields' order or
``WIRE_ORDER``. Readers and writers are built once per class (a heartbeat a second
from every node). Imports nothing of the package.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
import typing
from typing import Any, Callable, ClassVar, Dict, Mapping, NamedTuple, Optional, Tuple, Type, TypeVar, Union


class Int(NamedTuple):
    low: int
    high: int


class Real(NamedTuple):
    low: float = -math.inf
    high: float = math.inf
    digits: Optional[int] = None  # written rounded to this many decimals


class Text(NamedTuple):
    limit: int
    least: int = 0


class OneOf(NamedTuple):
    choices: Tuple[str, ...]  # a text (or a dict's key) that is one of these


class Items(NamedTuple):
    limit: int  # a list's or a dict's length, at most


class Hex(NamedTuple):
    size: int  # bytes, as exactly this many bytes in hex digits


class Via(NamedTuple):
    """A field's own code: ``read`` raises ``ValueError`` saying what is wrong."""

    read: Optional[Callable[[Any], Any]]  # None: read by its type
    write: Optional[Callable[[Any], Any]] = None  # None: written by its type


class _Mark(enum.Enum):
    NEED = "on the wire even though it has a default: refused when absent"
    SKIP = "left off the wire at its default"
    LOCAL = "never on the wire"


NEED, SKIP, LOCAL = _Mark.NEED, _Mark.SKIP, _Mark.LOCAL

R = TypeVar("R", bound="Record")
L = TypeVar("L", bound="Lenient")
D = TypeVar("D", bound="_Readable")
Reader = Callable[[Any, Type[Exception]], Any]
Writer = Callable[[Any], Any]


class Written:
    """A dataclass written by its fields' types."""

    DROP_NONE: ClassVar[bool] = False  # its null fields left off
    WIRE_ORDER: ClassVar[Tuple[str, ...]] = ()

    def to_wire(self) -> Dict[str, Any]:
        return encode(self)


class _Readable(Written):
    ERROR: ClassVar[Type[Exception]] = ValueError

    def problem(self) -> Optional[str]:
        """What is wrong across fields (each one checked already), or None."""
        return None


class Record(_Readable):
    """A dataclass read and written by its fields' types."""

    @classmethod
    def from_wire(cls: Type[R], data: Any) -> R:
        return decode(cls, data)


class Lenient(_Readable):
    """A stored dataclass read back by its fields' types, leniently (see above)."""

    @classmethod
    def from_wire(cls: Type[L], data: Any) -> Optional[L]:
        """The record, or None where ``data`` is not one."""
        try:
            return decode(cls, data)
        except cls.ERROR:
            return None


class _Bad(Exception):
    """One value's problem; the field's name is added where it is known."""


class _Field(NamedTuple):
    name: str
    read: Reader
    write: Writer
    optional: bool  # absent or null: its default
    local: bool
    skip: Any  # the default it is left off at, or _NO
    derived: bool = False  # a property: written, never read
    fallback: bool = False  # a Lenient record's: a bad value reads as its default, or None


_NO: Any = dataclasses.MISSING
_FIELDS: Dict[type, Tuple[_Field, ...]] = {}


def _fields(cls: type) -> Tuple[_Field, ...]:
    found = _FIELDS.get(cls)
    if found is None:
        late = getattr(cls, "LATE_TYPES", None)  # a function: the field types its module loads late, by name
        hints = typing.get_type_hints(cls, localns=late() if late is not None else None, include_extras=True)
        order = getattr(cls, "WIRE_ORDER", ())  # the JSON's key order, where it is not the fields'
        readable = issubclass(cls, _Readable)  # a record only written declares no reading bounds
        lenient = issubclass(cls, Lenient)
        found = tuple(_field(f, *_split(hints[f.name]), readable, lenient) for f in dataclasses.fields(cls))
        names = {f.name for f in found}
        found += tuple(_derived(cls, name) for name in order if name not in names)
        last = len(order)  # a field the order leaves out (a LOCAL one) goes last
        found = _FIELDS[cls] = tuple(sorted(found, key=lambda f: order.index(f.name) if f.name in order else last))
    return found


def _derived(cls: type, name: str) -> _Field:
    """A property written under its name, by its return type."""
    kind = typing.get_type_hints(getattr(cls, name).fget, include_extras=True)["return"]
    return _Field(name, _unread, _writer(*_split(kind)), True, False, _NO, True)


def _field(f: dataclasses.Field, kind: Any, specs: Tuple[Any, ...], readable: bool, lenient: bool) -> _Field:
    default = f.default
    if f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    try:
        read = _reader(kind, specs, lenient) if readable and LOCAL not in specs else _unread
    except AttributeError:  # a bound not given (a spec of None)
        raise TypeError("codec: field %r has no bounds to be read by" % f.name) from None
    optional = default is not _NO and NEED not in specs
    nullable = typing.get_origin(kind) is Union and type(None) in typing.get_args(kind)
    return _Field(f.name, read, _writer(kind, specs), optional, LOCAL in specs, default if SKIP in specs else _NO,
                  False, lenient and (optional or nullable and NEED not in specs))


def _split(kind: Any, specs: Tuple[Any, ...] = ()) -> Tuple[Any, Tuple[Any, ...]]:
    """The type without ``Annotated``, and its specs."""
    if typing.get_origin(kind) is typing.Annotated:
        return kind.__origin__, specs + tuple(kind.__metadata__)
    return kind, specs


def _spec(specs: Tuple[Any, ...], kind: Type[Any]) -> Any:
    return next((s for s in specs if isinstance(s, kind)), None)


def _inner(kind: Any) -> Any:
    return next(a for a in typing.get_args(kind) if a is not type(None))


def decode(cls: Type[D], data: Any, error: Optional[Type[Exception]] = None) -> D:
    """The record ``data`` holds, each field checked; ``error`` (the record's
    ``ERROR`` by default) names the first bad one."""
    error = error or cls.ERROR
    if not isinstance(data, Mapping):
        raise error("not an object (a %s)" % cls.__name__)
    values = {}
    for f in _fields(cls):
        value = data.get(f.name)
        if f.local or f.derived or value is None and f.optional:
            continue  # its default
        try:
            values[f.name] = f.read(value, error)
        except _Bad as e:
            if f.fallback:
                if not f.optional:
                    values[f.name] = None
                continue
            raise error("field %r: %s" % (f.name, e)) from None
    record = cls(**values)
    problem = record.problem()
    if problem:
        raise error(problem)
    return record


def _reader(kind: Any, specs: Tuple[Any, ...] = (), lenient: bool = False) -> Reader:
    """``lenient``: texts and lists cut, not refused; a bad item left out."""
    kind, specs = _split(kind, specs)
    via, origin = _spec(specs, Via), typing.get_origin(kind)
    if via is not None and via.read is not None:
        return _read_via(via.read)
    if origin is Union:
        inner = _reader(_inner(kind), specs, lenient)
        return lambda value, error: None if value is None else inner(value, error)
    if origin in (tuple, list):
        return _read_items(origin, _reader(typing.get_args(kind)[0], (), lenient), _spec(specs, Items).limit, lenient)
    if origin is dict:
        key, item = typing.get_args(kind)
        return _read_dict(_key_reader(*_split(key)), _reader(item, (), lenient), _spec(specs, Items).limit, lenient)
    if isinstance(kind, type) and issubclass(kind, _Readable):
        return _read_record(kind)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return _read_via(kind, "not one of %s" % ", ".join(str(m.value) for m in kind))
    read = _scalar(kind, specs, lenient)
    return lambda value, error: read(value)


def _unread(value: Any, error: Type[Exception]) -> Any:
    raise TypeError("codec: a record that is only written is never read")


def _read_via(read: Callable[[Any], Any], said: str = "") -> Reader:
    """``read``, its ``ValueError`` the field's problem (``said``, else its own words)."""
    def via(value: Any, error: Type[Exception]) -> Any:
        try:
            return read(value)
        except ValueError as e:
            raise _Bad(said or str(e)) from None
    return via


def _read_record(kind: Type[_Readable]) -> Reader:
    def record(value: Any, error: Type[Exception]) -> Any:
        try:
            return decode(kind, value, error)
        except error as e:
            raise _Bad(str(e)) from None
    return record


def _read_items(make: Any, each: Reader, limit: int, lenient: bool) -> Reader:
    def items(value: Any, error: Type[Exception]) -> Any:
        if not isinstance(value, list) or len(value) > limit:
            raise _Bad("not a list of at most %d" % limit)
        return make(each(v, error) for v in value)

    def kept(value: Any, error: Type[Exception]) -> Any:
        if not isinstance(value, list):
            raise _Bad("not a list")
        out = []
        for v in value[:limit]:
            try:
                out.append(each(v, error))
            except _Bad:
                pass  # left out
        return make(out)
    return kept if lenient else items


def _read_dict(key: Callable[[Any], Any], item: Reader, limit: int, lenient: bool) -> Reader:
    def entries(value: Any, error: Type[Exception]) -> Any:
        if not isinstance(value, Mapping) or len(value) > limit:
            raise _Bad("not an object of at most %d entries" % limit)
        return {key(k): item(v, error) for k, v in value.items()}

    def kept(value: Any, error: Type[Exception]) -> Any:
        if not isinstance(value, Mapping):
            raise _Bad("not an object")
        out = {}
        for k, v in itertools.islice(value.items(), limit):
            try:
                out[key(k)] = item(v, error)
            except _Bad:
                pass  # left out
        return out
    return kept if lenient else entries


def _key_reader(kind: Any, specs: Tuple[Any, ...]) -> Callable[[Any], Any]:
    read = _scalar(kind, specs)
    if kind is not int:
        return read

    def number(key: Any) -> int:
        try:
            return read(int(key))
        except (TypeError, ValueError):
            raise _Bad("a key that is not a number") from None
    return number


def _scalar(kind: Any, specs: Tuple[Any, ...], lenient: bool = False) -> Callable[[Any], Any]:
    """The reader of a bool, a bounded int, float or text (cut, if ``lenient``), or bytes in hex."""
    if kind is bool:
        return _check(lambda v: isinstance(v, bool), "not a boolean")
    if kind is int:
        b = _spec(specs, Int)
        return _check(lambda v: isinstance(v, int) and not isinstance(v, bool) and b.low <= v <= b.high,
                      "not an integer in [%d, %d]" % (b.low, b.high))
    if kind is float:
        b = _spec(specs, Real) or Real()
        real = _check(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                      and not (isinstance(v, int) and abs(v) >= 2**53) and math.isfinite(v) and b.low <= v <= b.high,
                      "not a number in [%g, %g]" % (b.low, b.high))
        return lambda v: float(real(v))
    if kind is str:
        one, b = _spec(specs, OneOf), _spec(specs, Text)
        if one is not None:
            return _check(lambda v: v in one.choices, "not one of %s" % ", ".join(one.choices))
        if lenient:
            text = _check(lambda v: isinstance(v, str) and b.least <= len(v),
                          "not a string of %d+ characters" % b.least)
            return lambda v: text(v)[:b.limit]
        return _check(lambda v: isinstance(v, str) and b.least <= len(v) <= b.limit,
                      "not a string of %d to %d characters" % (b.least, b.limit))
    if kind is bytes:
        size = _spec(specs, Hex).size
        text = _check(lambda v: isinstance(v, str) and len(v) == 2 * size, "not %d hex digits" % (2 * size))
        return lambda v: _hex(text(v))
    raise TypeError("codec: no reader for %r" % (kind,))


def _check(ok: Callable[[Any], bool], said: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not ok(value):
            raise _Bad(said)
        return value
    return check


def _hex(text: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise _Bad("not hex") from None


def encode(record: Any) -> Dict[str, Any]:
    """The record's JSON object, its fields in their order."""
    out = {}
    drop_none = getattr(record, "DROP_NONE", False)
    for f in _fields(type(record)):
        value = getattr(record, f.name)
        if f.local or f.skip is not _NO and value == f.skip:
            continue
        wire = None if value is None else f.write(value)
        if wire is not None or not drop_none:
            out[f.name] = wire
    return out


def _writer(kind: Any, specs: Tuple[Any, ...] = ()) -> Writer:
    kind, specs = _split(kind, specs)
    via, origin = _spec(specs, Via), typing.get_origin(kind)
    if via is not None and via.write is not None:
        return via.write
    if origin is Union:
        inner = _writer(_inner(kind), specs)
        return lambda value: None if value is None else inner(value)
    if origin in (tuple, list):
        each, most = _writer(typing.get_args(kind)[0]), _spec(specs, Items)
        return lambda value: [each(v) for v in (value if most is None else value[:most.limit])]
    if origin is dict:
        key, item = typing.get_args(kind)
        return _write_dict(_spec(_split(key)[1], OneOf), _writer(item), _spec(specs, Items))
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return lambda value: value.value
    if kind is float:
        b = _spec(specs, Real) or Real()
        if b.digits is None:
            return lambda value: min(max(value, b.low), b.high)
        return lambda value: round(min(max(value, b.low), b.high), b.digits)
    text = _spec(specs, Text)
    if kind is str and text is not None:
        return lambda value: value[:text.limit]
    if kind is bytes:
        return lambda value: value.hex()
    if hasattr(kind, "to_wire"):
        return lambda value: value.to_wire()
    return lambda value: value


def _write_dict(one: Optional[OneOf], item: Writer, b: Optional[Items]) -> Writer:
    def entries(value: Mapping[Any, Any]) -> Dict[Any, Any]:
        pairs = [(k, v) for k, v in value.items() if one is None or k in one.choices]
        return {str(k) if isinstance(k, int) else k: item(v) for k, v in (pairs if b is None else pairs[:b.limit])}
    return entries
