"""Pure: torchrun options as a user gives them, read into ``{canonical name: value}``; the options
@torchrun sets itself refused, naming the @torchrun way."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..errors import Problems, TorchrunInvalidArgument, did_you_mean, shown

ArgSpec = Any  # a list, a tuple, a mapping or None (command.ArgSpec)

_SCALARS = (str, int, float, os.PathLike)


def scalar(value: Any, what: str) -> str:
    # bool is an int subclass: in a list it is spelled as Python spells it.
    if isinstance(value, _SCALARS):
        try:
            return os.fsdecode(value) if isinstance(value, os.PathLike) else str(value)
        except Exception as e:
            raise TorchrunInvalidArgument("%s: cannot turn a %s into a command-line argument (str() failed: %s: %s)."
                                          % (what, type(value).__name__, type(e).__name__, e)) from None
    raise TorchrunInvalidArgument("%s: cannot pass %s (a %s) as a command-line argument; use a string or a number."
                                  % (what, shown(value), type(value).__name__))


def flag_name(key: Any, what: str) -> str:
    if not isinstance(key, str) or not key.strip("-"):
        raise TorchrunInvalidArgument("%s: option name %s must be a non-empty string." % (what, shown(key)))
    return "--" + key.lstrip("-")


_RENDEZVOUS = (
    "@torchrun runs torchrun's c10d rendezvous on the control node and chooses its "
    "endpoint and id per gang; extra settings go in rdzv_conf, which adds to ours"
)
_ENTRY = (
    "@torchrun starts every rank through its own bootstrap: give a script path or a "
    "module-level function as current.torch.run(entrypoint=...)"
)

# Canonical torchrun option -> how to get what it does with @torchrun.
OWNED_OPTIONS: Dict[str, str] = {
    "master-port": "the port is @torchrun(port=N) (on Kubernetes, @kubernetes(port=N) is used)",
    "master-addr": "@torchrun finds the control node's address itself (current.parallel.main_ip)",
    "nnodes": "the node count is num_parallel: self.next(self.<step>, num_parallel=N)",
    "node-rank": "each node's index comes from Metaflow (current.parallel.node_index)",
    "rdzv-backend": _RENDEZVOUS,
    "rdzv-endpoint": _RENDEZVOUS,
    "rdzv-id": _RENDEZVOUS,
    "standalone": "for one node, enter the step with num_parallel=1",
    "no-python": _ENTRY,
    "module": _ENTRY,
    "run-path": _ENTRY,
    "shutdown-timeout": "the ranks' time to stop on SIGTERM is @torchrun(shutdown_grace=SECONDS)",
}


# Options no step under @torchrun can use, refused by name whatever the task's torch (2.14 added
# --print-completion; 2.13 would call it unknown, with a worse fix).
UNUSABLE_OPTIONS: Dict[str, str] = {
    "print-completion": (
        "torchrun would print a shell completion script and exit without starting a rank; "
        "for the script, run `torchrun --print-completion SHELL` in a shell"
    ),
}


def owned_option_error(name: str, what: str) -> Optional[str]:
    """Why an option @torchrun sets itself or cannot use is refused, naming the @torchrun way; an
    abbreviation of one too (torchrun's argparse expands it)."""
    reason = OWNED_OPTIONS.get(name)
    if reason is not None:
        return "%s: --%s is set by @torchrun and cannot be given: %s." % (what, name, reason)
    reason = UNUSABLE_OPTIONS.get(name)
    if reason is not None:
        return "%s: --%s cannot be used under @torchrun: %s." % (what, name, reason)
    expands = sorted(o for o in (*OWNED_OPTIONS, *UNUSABLE_OPTIONS) if o.startswith(name))
    if expands:
        why = "@torchrun sets itself" if expands[0] in OWNED_OPTIONS else "cannot be used under @torchrun"
        reason = OWNED_OPTIONS.get(expands[0]) or UNUSABLE_OPTIONS.get(expands[0])
        return ("%s: --%s is an abbreviation torchrun would read as %s, which %s: %s."
                % (what, name, " or ".join("--" + o for o in expands), why, reason))
    return None


def refuse_owned(options: Mapping[str, Any], what: str) -> None:
    problems = [m for m in (owned_option_error(k, what) for k in options) if m]
    if problems:
        raise TorchrunInvalidArgument(" ".join(problems))


_SHORT = {"m": "module", "r": "redirects", "t": "tee"}  # torchrun's one-letter options
# Anything else in a name ('=', spaces) would reach torchrun's parser as more than a name.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*\Z")


def canonical_option(name: str) -> str:
    """torchrun spells options both ``max_restarts`` and ``max-restarts``."""
    bare = name.strip().lstrip("-").replace("_", "-")
    return _SHORT.get(bare, bare)


def _checked_name(key: Any, what: str) -> str:
    flag_name(key, what)
    bare = key.strip().lstrip("-")
    if not _NAME.match(bare):
        raise TorchrunInvalidArgument(
            "%s: %s is not a torchrun option name (letters, digits, '-' and '_' only): torchrun would read what "
            "follows as more options or values." % (what, shown(key)))
    return canonical_option(key)


def _checked_value(text: str, what: str, name: str) -> str:
    """No torchrun option takes a value starting with '-' (but a negative number): it would be read as one."""
    if text.startswith("-") and not _is_number(text):
        raise TorchrunInvalidArgument(
            "%s: the value %s of --%s starts with '-': torchrun would read it as an option of its own, not as the "
            "value. torchrun takes no such value." % (what, shown(text), name))
    return text


@dataclass(frozen=True)
class OptionSpec:
    """How torchrun's parser reads one option (``torch_checks`` reads it from torch's source)."""

    takes_value: bool
    type: str = "str"  # "int", "float" or "str"
    choices: Optional[Tuple[str, ...]] = None  # the values it takes, where torch lists them


Specs = Mapping[str, OptionSpec]


def parse_options(args: ArgSpec, what: str = "torchrun_args", check_owned: bool = True, allow: Tuple[str, ...] = (),
                  specs: Optional[Specs] = None) -> Dict[str, Any]:
    """A dict, argv (``["--max-restarts", "2"]``) or 0.2's pairs (``["max_restarts", 2]``) as
    ``{canonical name: value}``: ``True`` a bare flag (0.2's ``None`` too, deprecated), ``False`` removes
    one of ours, ``''`` refused. Options @torchrun sets are refused with the @torchrun way, unless
    ``check_owned`` is False or the name is in ``allow`` (the caller translates it). With ``specs``, each
    value is checked as torchrun's parser reads it (an int option's is an ``int``), so that whatever reads
    the result (``restarts_allowed``) sees only values torchrun takes. Every problem in one message."""
    if args is None:
        return {}
    if isinstance(args, Mapping):
        out: Dict[str, Any] = {}
        problems = Problems()
        for key, value in args.items():
            name = problems.check(_checked_name, key, what)
            owned = owned_option_error(name, what) if check_owned and name is not None and name not in allow else None
            if owned:
                problems.add(owned)  # the @torchrun way, whatever the value
            elif name is not None:
                value = problems.check(_option_value, value, what, key, _spec(specs, name))
                if value is not None:
                    out[name] = value
        problems.raise_all()
    elif isinstance(args, (list, tuple)):
        if args and isinstance(args[0], str) and not args[0].startswith("-"):  # 0.2's ["max_restarts", 1]
            out = _parse_pairs(list(args), what, specs)
        else:
            out = _typed_argv(_parse_argv([scalar(v, what) for v in args], args, what), what, specs)
    else:
        raise TorchrunInvalidArgument("%s must be a list or a dict, not %s %s."
                                      % (what, type(args).__name__, shown(args)))
    if check_owned:
        refuse_owned({k: v for k, v in out.items() if k not in allow}, what)
    return out


def _spec(specs: Optional[Specs], name: Optional[str]) -> Optional[OptionSpec]:
    return specs.get(name) if specs is not None and name is not None else None


def _option_value(value: Any, what: str, key: Any, spec: Optional[OptionSpec] = None, pair: bool = False) -> Any:
    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            raise TorchrunInvalidArgument(_several_values_error(what, key, list(value)))
        value = value[0]
    if spec is not None:
        where = "%s %s" % (what, shown([key, value])) if pair else "%s[%s]" % (what, shown(key))
        return typed_value(value, canonical_option(str(key)), spec, where, _spelling(key, pair))
    if value is None:  # metaflow-torchrun 0.2's bare flag (deprecated, see plan.py)
        return True
    if value is True or value is False:
        return value
    text = scalar(value, "%s[%s]" % (what, shown(key)))
    if text == "":
        raise TorchrunInvalidArgument("%s[%s] is ''. torchrun options take no empty value: write True for a bare --%s "
                                      "(what metaflow-torchrun 0.2 made of ''), or False to leave it out."
                                      % (what, shown(key), str(key).lstrip("-")))
    return _checked_value(text, what, canonical_option(str(key)))


def _several_values_error(what: str, key: Any, values: List[Any]) -> str:
    return ("%s: --%s is given %d values %s; every torchrun option takes one, and torchrun would read the others "
            "as the script to run and its arguments." % (what, str(key).lstrip("-"), len(values), shown(values)))


_KINDS = {"int": "an integer", "float": "a number", "str": "a value"}
_EXAMPLES = {"int": 2, "float": 0.5, "str": "..."}


def _spelling(key: Any, pair: bool) -> str:
    """How the user writes ``key: VALUE`` where they wrote it, as a %-template."""
    return "[..., %r, %%s]" % (key,) if pair else "{%r: %%s}" % (key,)


def typed_value(value: Any, name: str, spec: OptionSpec, where: str, spelling: Optional[str] = None) -> Any:
    """``value`` as torchrun's parser reads ``--name`` (``True``/``False`` for a flag, an ``int`` for an int
    option, else the text); what it would refuse or misread is refused, naming the right spelling."""
    if value is False:
        return False
    if not spec.takes_value:
        if value is True or value is None:  # None: 0.2's bare flag (deprecated, see plan.py)
            return True
        raise TorchrunInvalidArgument(
            "%s is %s, but torchrun's --%s is a flag and takes no value: write %s to pass it, or %s to leave it out."
            % (where, shown(value), name, (spelling or "%s") % True, (spelling or "%s") % False))
    kind = _KINDS.get(spec.type, "a value")
    example = _EXAMPLES.get(spec.type, "...")
    if spelling is None:  # argv: the value after the name
        fix = "write %s" % shown(["--" + name, str(example)])
    else:
        fix = "write %s, or %s to leave it out" % (spelling % repr(example), spelling % False)
    if value is None or value is True:
        was = " (None was metaflow-torchrun 0.2's bare flag)" if value is None else ""
        raise TorchrunInvalidArgument("%s is %s, but torchrun's --%s takes %s, it is not a flag%s: %s."
                                      % (where, shown(value), name, kind, was, fix))
    text = scalar(value, where)
    wrong = "%s is %s, but torchrun's --%s takes %s: %s." % (where, shown(value), name, kind, fix)
    if not text.strip():
        raise TorchrunInvalidArgument(wrong)
    text = _checked_value(text, where, name)
    try:
        if spec.type == "int":
            return int(text)
        if spec.type == "float":
            float(text)
    except ValueError:
        raise TorchrunInvalidArgument(wrong) from None
    if spec.choices is not None and text not in spec.choices:
        raise TorchrunInvalidArgument("%s is %s, but torchrun's --%s takes one of %s%s." % (
            where, shown(value), name, ", ".join(map(repr, spec.choices)), did_you_mean(text, spec.choices)))
    return text


def _typed_argv(raw: Dict[str, Any], what: str, specs: Optional[Specs]) -> Dict[str, Any]:
    """argv read without knowing the options (``True``: nothing followed the name), checked against ``specs``."""
    if specs is None:
        return raw
    out: Dict[str, Any] = {}
    problems = Problems()
    for name, value in raw.items():
        spec = specs.get(name)
        if spec is None:
            out[name] = value
        elif value is True and spec.takes_value:
            problems.add(
                "%s: --%s has no value after it, but torchrun's --%s takes %s: write %s."
                % (what, name, name, _KINDS.get(spec.type, "a value"),
                   shown(["--" + name, str(_EXAMPLES.get(spec.type, "..."))])))
        elif isinstance(value, str) and not spec.takes_value:
            problems.add(
                "%s: --%s is a flag and takes no value, but is given %s: write %s alone."
                % (what, name, shown(value), shown("--" + name)))
        else:
            typed = problems.check(typed_value, value, name, spec, "%s: the value of --%s" % (what, name))
            if typed is not None:
                out[name] = typed
    problems.raise_all()
    return out


def _parse_pairs(items: List[Any], what: str, specs: Optional[Specs] = None) -> Dict[str, Any]:
    """metaflow-torchrun 0.2's list form: ``["nproc_per_node", 2, "max_restarts", 1]``."""
    if len(items) % 2:
        raise TorchrunInvalidArgument(
            "%s=%s: a list that starts with a name without dashes is read as name, value pairs (metaflow-torchrun "
            "0.2), and this one has an odd length. Write [\"--name\", \"value\", ...] (torchrun's argv) or a dict."
            % (what, shown(items)))
    out: Dict[str, Any] = {}
    problems = Problems()
    for key, value in zip(items[0::2], items[1::2]):
        name = problems.check(_checked_name, key, what)
        if name is not None:
            typed = problems.check(_option_value, value, what, key, _spec(specs, name), True)
            if typed is not None:
                out[name] = typed
    problems.raise_all()
    return out


def _parse_argv(tokens: List[str], args: Any, what: str) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    key: Optional[str] = None
    for token in tokens:
        if token.startswith("-") and len(token) > 1 and not _is_number(token):
            name, eq, value = token.partition("=")
            name = _checked_name(name, what)
            if eq:
                out[name] = _checked_value(value, what, name)
                key = None
            else:
                key = name
                out[key] = True
        elif key is None:
            raise TorchrunInvalidArgument("%s: %s is not preceded by an option name (in %s)."
                                          % (what, shown(token), shown(list(args))))
        else:
            if out[key] is not True:
                raise TorchrunInvalidArgument(_several_values_error(what, key, [out[key], token]))
            out[key] = token
    return out


def _is_number(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False
