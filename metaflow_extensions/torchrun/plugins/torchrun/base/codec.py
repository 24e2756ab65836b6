"""One codec for the package's records: a frozen dataclass written to JSON and read
back field by field, each checked by the type and bounds its annotation gives
(``Annotated[int, Int(0, MAX_CALL)]``), with no hand-written pair per record. Absent
or null reads as the default; the other rules are docs/design.md's (the module map).
Written: only what the reader takes (cut, clamped), keys in the fields' order or
``WIRE_ORDER``. Each class's reader and writer is compiled once, into one function
each, as dataclasses makes ``__init__`` (a heartbeat a second from every node).
Imports nothing of the package.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import keyword
import linecache
import math
import typing
from typing import Any, Callable, ClassVar, Dict, List, Mapping, NamedTuple, Optional, Tuple, Type, TypeVar, Union


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
    write: Writer  # of a value that is not None
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
    return _Field(name, _unread, _writer(*_split(_not_none(kind))), True, False, _NO, True)


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
    return _Field(f.name, read, _writer(_not_none(kind), specs), optional, LOCAL in specs,
                  default if SKIP in specs else _NO, False, lenient and (optional or nullable and NEED not in specs))


def _split(kind: Any, specs: Tuple[Any, ...] = ()) -> Tuple[Any, Tuple[Any, ...]]:
    """The type without ``Annotated``, and its specs."""
    if typing.get_origin(kind) is typing.Annotated:
        return kind.__origin__, specs + tuple(kind.__metadata__)
    return kind, specs


def _spec(specs: Tuple[Any, ...], kind: Type[Any]) -> Any:
    return next((s for s in specs if isinstance(s, kind)), None)


def _inner(kind: Any) -> Any:
    return next(a for a in typing.get_args(kind) if a is not type(None))


def _not_none(kind: Any) -> Any:
    """``Optional[X]`` as X: a field's null is written as null before its writer is asked."""
    return _inner(kind) if typing.get_origin(kind) is Union and type(None) in typing.get_args(kind) else kind


def decode(cls: Type[D], data: Any, error: Optional[Type[Exception]] = None) -> D:
    """The record ``data`` holds, each field checked; ``error`` (the record's
    ``ERROR`` by default) names the first bad one."""
    read = _READERS.get(cls) or _compiled(cls, _READERS, _compile_reader)
    return read(data, error or cls.ERROR)


def encode(record: Any) -> Dict[str, Any]:
    """The record's JSON object, its fields in their order."""
    cls = type(record)
    write = _WRITERS.get(cls) or _compiled(cls, _WRITERS, _compile_writer)
    return write(record)


# -- each class's reader and writer, compiled once: a heartbeat a second from every node ---------------

_READERS: Dict[type, Callable[[Any, Type[Exception]], Any]] = {}
_WRITERS: Dict[type, Callable[[Any], Dict[str, Any]]] = {}


def _compiled(cls: type, cache: Dict[type, Any], compile_one: Callable[[type], Tuple[str, Dict[str, Any]]]) -> Any:
    """The function ``compile_one`` writes for ``cls``, in source, made once (as dataclasses makes
    ``__init__``): every field's read inline, no loop over descriptions of fields at each message.
    What the source names beyond builtins comes from its namespace, never from the wire."""
    source, names = compile_one(cls)
    where = "<codec %s.%s %s>" % (cls.__module__, cls.__qualname__, "reader" if cache is _READERS else "writer")
    linecache.cache[where] = (len(source), None, source.splitlines(True), where)  # for tracebacks
    exec(compile(source, where, "exec"), names)
    made = cache[cls] = names["made"]
    return made


def _compile_reader(cls: type) -> Tuple[str, Dict[str, Any]]:
    fields = [f for f in _fields(cls) if not f.local and not f.derived]
    names: Dict[str, Any] = {"Mapping": Mapping, "_Bad": _Bad, "cls": cls, "new": object.__new__,
                             "NOT_AN_OBJECT": "not an object (a %s)" % cls.__name__}
    lines = ["def made(data, error):",
             "    if data.__class__ is not dict and not isinstance(data, Mapping):",
             "        raise error(NOT_AN_OBJECT)",
             "    get = data.get"]
    for i, f in enumerate(fields):
        names["read%d" % i] = f.read
        lines += _read_lines(i, f, names, _dataclass_field(cls, f.name))
    read = {f.name: "v%d" % i for i, f in enumerate(fields)}
    lines += _make_lines(cls, read, names)
    if getattr(cls, "problem", _Readable.problem) is not _Readable.problem:
        lines += ["    problem = record.problem()",
                  "    if problem:",
                  "        raise error(problem)"]
    lines.append("    return record")
    return "\n".join(lines) + "\n", names


def _name(name: str) -> str:
    """A field's name, as the source spells it (an attribute, a key's literal): a name, nothing else."""
    if not name.isidentifier() or keyword.iskeyword(name):
        raise TypeError("codec: field %r is not a name" % name)
    return name


def _read_lines(i: int, f: _Field, names: Dict[str, Any], default: Any) -> List[str]:
    """Field ``i`` into ``v<i>``: absent or null as its default where it has one, else its reader's."""
    v = "v%d" % i
    lines = ["    %s = get(%r)" % (v, _name(f.name))]
    pad = "    "
    if f.optional:
        lines += ["    if %s is None:" % v, "        %s = %s" % (v, _default_expr(v, default, names)), "    else:"]
        pad = "        "
    lines += [pad + "try:",
              pad + "    %s = read%d(%s, error)" % (v, i, v),
              pad + "except _Bad as e:"]
    if f.fallback:  # a Lenient record's: a bad value as its default, or None
        lines.append(pad + "    %s = %s" % (v, _default_expr(v, default, names) if f.optional else "None"))
    else:
        lines.append(pad + "    raise error(%s %% e) from None" % repr("field %r: %%s" % f.name))
    return lines


def _dataclass_field(cls: type, name: str) -> Any:
    return next(f for f in dataclasses.fields(cls) if f.name == name)


def _default_expr(key: str, field: Any, names: Dict[str, Any]) -> str:
    """A fresh value of a factory's default (a dict is never shared between records), else the default."""
    if field.default_factory is not dataclasses.MISSING:
        names["factory_" + key] = field.default_factory
        return "factory_%s()" % key
    names["default_" + key] = field.default
    return "default_" + key


def _make_lines(cls: type, read: Dict[str, str], names: Dict[str, Any]) -> List[str]:
    """The record: a plain frozen dataclass's fields set as its ``__init__`` would set them (a third of the
    time of calling it); a class with more to its making (``__post_init__``, slots) made by its call."""
    every = dataclasses.fields(cls)
    unset = [f for f in every if f.name not in read]
    if hasattr(cls, "__post_init__") or hasattr(cls, "__slots__") or not all(f.init for f in every) or any(
            f.default is _NO and f.default_factory is _NO for f in unset):
        names["keys"] = tuple(read)
        return ["    record = cls(**dict(zip(keys, (%s,))))" % ", ".join(read.values())]
    lines = ["    record = new(cls)", "    fields = record.__dict__"]
    for j, f in enumerate(every):
        value = read.get(f.name) or _default_expr("unread%d" % j, f, names)
        lines.append("    fields[%r] = %s" % (_name(f.name), value))
    return lines


def _compile_writer(cls: type) -> Tuple[str, Dict[str, Any]]:
    """Each field under its name, skipped at its ``SKIP`` default, null left off where ``DROP_NONE``."""
    drop_none = getattr(cls, "DROP_NONE", False)
    names: Dict[str, Any] = {}
    lines = ["def made(record):", "    out = {}"]
    for i, f in enumerate(f for f in _fields(cls) if not f.local):
        names.update({"write%d" % i: f.write, "skip%d" % i: f.skip})
        lines.append("    v = record.%s" % _name(f.name))
        pad = "    "
        if f.skip is not _NO:
            lines.append("    if not v == skip%d:" % i)
            pad += "    "
        wire = "v" if f.write is _same else "write%d(v)" % i
        if drop_none:
            lines += [pad + "if v is not None:"] + (
                [pad + "    out[%r] = v" % f.name] if wire == "v" else
                [pad + "    v = %s" % wire, pad + "    if v is not None:", pad + "        out[%r] = v" % f.name])
        else:
            lines.append(pad + "out[%r] = None if v is None else %s" % (f.name, wire))
    lines.append("    return out")
    return "\n".join(lines) + "\n", names


# -- each field's reader and writer, built once per class --------------------------------------------


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
    return _scalar(kind, specs, lenient)


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
        return make([each(v, error) for v in value])

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


def _read_dict(key: Reader, item: Reader, limit: int, lenient: bool) -> Reader:
    def entries(value: Any, error: Type[Exception]) -> Any:
        if not isinstance(value, Mapping) or len(value) > limit:
            raise _Bad("not an object of at most %d entries" % limit)
        return {key(k, error): item(v, error) for k, v in value.items()}

    def kept(value: Any, error: Type[Exception]) -> Any:
        if not isinstance(value, Mapping):
            raise _Bad("not an object")
        out = {}
        for k, v in itertools.islice(value.items(), limit):
            try:
                out[key(k, error)] = item(v, error)
            except _Bad:
                pass  # left out
        return out
    return kept if lenient else entries


def _key_reader(kind: Any, specs: Tuple[Any, ...]) -> Reader:
    read = _scalar(kind, specs)
    if kind is not int:
        return read

    def number(key: Any, error: Type[Exception]) -> int:
        try:
            whole = int(key)
        except (TypeError, ValueError):
            raise _Bad("a key that is not a number") from None
        return read(whole, error)
    return number


def _scalar(kind: Any, specs: Tuple[Any, ...], lenient: bool = False) -> Reader:
    """The reader of a bool, a bounded int, float or text (cut, if ``lenient``), or bytes in hex: one
    call, the common case (a value of exactly its type) tested first."""
    if kind is bool:
        return _boolean
    if kind is int:
        return _integer(_spec(specs, Int))
    if kind is float:
        return _real(_spec(specs, Real) or Real())
    if kind is str:
        one = _spec(specs, OneOf)
        return _one_of(one.choices) if one is not None else _text(_spec(specs, Text), lenient)
    if kind is bytes:
        return _hex(_spec(specs, Hex).size)
    raise TypeError("codec: no reader for %r" % (kind,))


def _boolean(value: Any, error: Type[Exception]) -> bool:
    if value is True or value is False:
        return value
    raise _Bad("not a boolean")


def _integer(b: Int) -> Reader:
    low, high, said = b.low, b.high, "not an integer in [%d, %d]" % (b.low, b.high)

    def integer(value: Any, error: Type[Exception]) -> int:
        if (value.__class__ is int or isinstance(value, int) and not isinstance(value, bool)) and low <= value <= high:
            return value
        raise _Bad(said)
    return integer


def _real(b: Real) -> Reader:
    """Finite (a whole number past 2**53 is not exact in a float) and within bounds; a float."""
    low, high, said = b.low, b.high, "not a number in [%g, %g]" % (b.low, b.high)

    def real(value: Any, error: Type[Exception]) -> float:
        if value.__class__ is float or isinstance(value, float):
            if math.isfinite(value) and low <= value <= high:
                return float(value)
        elif isinstance(value, int) and not isinstance(value, bool) and -2**53 < value < 2**53 and low <= value <= high:
            return float(value)
        raise _Bad(said)
    return real


def _one_of(choices: Tuple[str, ...]) -> Reader:
    said = "not one of %s" % ", ".join(choices)

    def one_of(value: Any, error: Type[Exception]) -> str:
        if value in choices:
            return value
        raise _Bad(said)
    return one_of


def _text(b: Text, lenient: bool) -> Reader:
    least, limit = b.least, b.limit
    said = ("not a string of %d+ characters" % least) if lenient else "not a string of %d to %d characters" % (
        least, limit)

    def text(value: Any, error: Type[Exception]) -> str:
        if (value.__class__ is str or isinstance(value, str)) and least <= len(value) <= limit:
            return value
        raise _Bad(said)

    def cut(value: Any, error: Type[Exception]) -> str:
        if (value.__class__ is str or isinstance(value, str)) and least <= len(value):
            return value[:limit]
        raise _Bad(said)
    return cut if lenient else text


def _hex(size: int) -> Reader:
    """Exactly ``size`` bytes: ``bytes.fromhex`` would take spaces between the digits, these do not."""
    digits, said = 2 * size, "not %d hex digits" % (2 * size)

    def hex_bytes(value: Any, error: Type[Exception]) -> bytes:
        if not isinstance(value, str) or len(value) != digits:
            raise _Bad(said)
        try:
            out = bytes.fromhex(value)
        except ValueError:
            raise _Bad("not hex") from None
        if len(out) != size:
            raise _Bad("not hex")
        return out
    return hex_bytes


def _same(value: Any) -> Any:
    """The writer of a value that is its own JSON (an int, a bool, a text of choices)."""
    return value


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
        if each is _same:
            return list if most is None else lambda value: list(value[:most.limit])
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
    return _same


def _write_dict(one: Optional[OneOf], item: Writer, b: Optional[Items]) -> Writer:
    def entries(value: Mapping[Any, Any]) -> Dict[Any, Any]:
        pairs = [(k, v) for k, v in value.items() if one is None or k in one.choices]
        return {str(k) if isinstance(k, int) else k: item(v) for k, v in (pairs if b is None else pairs[:b.limit])}
    return entries
