"""Where every rank was when the gang stopped: the Python stack of its main thread.

Why faulthandler: it writes from a C signal handler, so a rank stuck in a
collective, a data loader or any C call still answers, and it needs no ptrace,
no py-spy and no cooperation from the user's code. Each rank's bootstrap
registers it on ``STACK_SIGNAL``, writing into the rank's own file in the call's
work directory (``stack_path``); before a node stops its ranks it signals the
live ones and reads the files back (``collect``), within ``COLLECT_SECONDS``.

Only the main thread, by itself: the signal goes to it (``tgkill``), and
faulthandler dumps the thread that took it, whose frames cannot change while it
runs the handler. Asked for every thread, faulthandler walks the others' frames
while they run on (the Flight Recorder's thread answers at that very moment,
flight_ask.py), and a frame freed under it crashed the rank with SIGSEGV or cut
its dump short. A dump is known whole by its last line: the rank writes at the
top of its file, before it can be asked, the line its main thread's outermost
frame prints as (``ending``); a dump not whole within the bound is kept, marked
``UNFINISHED``, and said so.

The raw text goes to the card and the result record; ``summarize`` turns it
into the few lines the failure message shows: each rank, its innermost frame
in the user's own code, and where below that it actually was.
"""

from __future__ import annotations

import faulthandler
import linecache
import os
import re
import signal
import sys
import sysconfig
import time
from dataclasses import dataclass
from types import FrameType
from typing import IO, Dict, Iterable, List, Mapping, Optional, Tuple

from ..host import signal_main_thread
from .names import STACKS_SUFFIX, rank_file
from .ranges import numbers
from ..base import timeouts

# Real-time, like the gang's interrupt: SIGUSR1/2 belong to user code (SLURM-style
# checkpoint triggers), and a real-time signal nobody handles would kill a rank,
# which is why the bootstrap registers it before the user's code runs.
STACK_SIGNAL = signal.SIGRTMIN + 3
# A rank's dump is cut to this many bytes (faulthandler prints at most 100
# frames per thread, but a rank may have hundreds of threads).
MAX_STACK_BYTES = 16 * 1024
# The failure message shows this many places (ranks grouped by where they
# were); the card and the full report show every rank.
SUMMARY_PLACES = 12

_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
_THREAD = re.compile(r"^(?P<current>Current thread|Thread) (?P<ident>0x[0-9a-fA-F]+)|^Stack \(most recent")


def stack_path(directory: str, rank: int) -> str:
    return rank_file(directory, rank, STACKS_SUFFIX)


# A rank's stack file begins with this, then where the outermost frame of its
# main thread is, with which every dump ends: its file and function (``ending``).
_ENDS_WITH = "# each dump ends with the frame of"
# How faulthandler ends a dump short of the outermost frame: past its 100th
# frame, and for a thread with no Python frame left (the interpreter finishing).
_SHORT_ENDS = ("  ...", "  <no Python frame>")
# The first line of a dump the rank had not finished when the bound was reached.
UNFINISHED = "<unfinished: the rank had not written the rest of this dump when it was read>"
# faulthandler writes at most this many characters of a name, then "...".
_NAME_CHARS = 500


def ending(frame: FrameType) -> Tuple[str, str]:
    """The file and function of the outermost frame under ``frame``, as
    faulthandler prints them. While the rank runs, that frame stays (its line
    may move on, where a script called ``register`` from its top level), so the
    main thread's every dump ends with it."""
    while frame.f_back is not None:
        frame = frame.f_back
    return escaped(frame.f_code.co_filename), escaped(frame.f_code.co_name)


def escaped(text: str) -> str:
    """A name as faulthandler writes it: printable ASCII as it is, any other
    character as an escape, cut at 500 characters."""
    out = []
    for ch in text[:_NAME_CHARS]:
        code = ord(ch)
        if 32 <= code <= 126:
            out.append(ch)
        else:
            out.append("\\x%02x" % code if code <= 0xFF else "\\u%04x" % code if code <= 0xFFFF else "\\U%08x" % code)
    return "".join(out) + ("..." if len(text) > _NAME_CHARS else "")


# -- in the rank (bootstrap) -------------------------------------------------------


def register(directory: Optional[str], rank: int) -> Optional[IO[str]]:
    """Dump this rank's main thread into its file on ``STACK_SIGNAL``, the
    file's first line saying how each dump ends. The file stays open for the
    rank's life (faulthandler writes to its descriptor); the caller keeps the
    returned object alive."""
    if not directory or rank < 0:
        return None
    try:
        fd = os.open(stack_path(directory, rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    except OSError:
        return None
    out = os.fdopen(fd, "w", encoding="ascii", errors="backslashreplace")
    try:
        out.write("\t".join((_ENDS_WITH, *ending(sys._getframe()))) + "\n")  # escaped: no tab in either
        out.flush()
        # The thread that takes the signal alone: the node sends it to the main one.
        faulthandler.register(STACK_SIGNAL, file=out, all_threads=False, chain=False)
    except (OSError, ValueError, RuntimeError):
        out.close()
        return None
    return out


# -- on the node (before it stops its ranks) ----------------------------------------


def collect(directory: str, pids: Mapping[int, int], seconds: float = timeouts.COLLECT_SECONDS) -> Dict[int, str]:
    """Signal each live rank's main thread (rank -> pid) and read its dump back
    once it is whole (it ends as its file's first line says). A rank that wrote
    nothing within ``seconds`` is left out; what one that had not finished
    wrote is kept, ``UNFINISHED`` first."""
    asked: Dict[int, Tuple[str, int, Optional[Tuple[str, str]]]] = {}  # rank -> its file, where the dump begins, its end
    for rank, pid in pids.items():
        path = stack_path(directory, rank)
        begins = _size(path)
        try:
            signal_main_thread(pid, STACK_SIGNAL)  # not a torch thread: faulthandler dumps the one it runs in
        except OSError:
            continue
        asked[rank] = (path, begins, _ending_of(path))
    out: Dict[int, str] = {}
    deadline = time.monotonic() + seconds
    while True:
        last = time.monotonic() >= deadline
        for rank, (path, begins, ends) in list(asked.items()):
            if _whole(_tail(path, begins), ends):
                out[rank] = _read_from(path, begins)
            elif last:
                text = _read_from(path, begins)
                text = text[: text.rfind("\n") + 1]  # not a line the rank was half-way through
                if text.strip():
                    out[rank] = UNFINISHED + "\n" + text
            else:
                continue
            del asked[rank]
        if last or not asked:
            return out
        time.sleep(0.02)


def _ending_of(path: str) -> Optional[Tuple[str, str]]:
    """How the dumps in a rank's stack file end: its first line says. None for
    a file the rank did not begin (any dump in it is whole only when cut short)."""
    head = _read_from(path, 0).split("\n", 1)[0].split("\t")
    return (head[1], head[2]) if len(head) == 3 and head[0] == _ENDS_WITH else None


def _whole(tail: str, ends: Optional[Tuple[str, str]]) -> bool:
    """A dump whose last line is written and is the main thread's outermost
    frame, or faulthandler's own end of a dump cut short."""
    if not tail.endswith("\n"):
        return False
    last = tail[:-1].rsplit("\n", 1)[-1]
    if last in _SHORT_ENDS:
        return True
    return ends is not None and last.startswith('  File "%s", line ' % ends[0]) and last.endswith(" in " + ends[1])


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _tail(path: str, begins: int, most: int = MAX_STACK_BYTES) -> str:
    """The end of a dump that begins at ``begins``: its last line (at most two
    escaped names of 500 characters) whole."""
    return _read_from(path, max(begins, _size(path) - most), most)


def _read_from(path: str, offset: int, most: int = MAX_STACK_BYTES) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        f.seek(offset)
        data = f.read(most)
    return data.decode("utf-8", "replace")


def bound(stacks: Mapping[int, str], total: int) -> Dict[int, str]:
    """Stacks cut to fit ``total`` characters in all (for the gang's wire): each
    rank keeps its innermost frames, which come first."""
    if not stacks:
        return {}
    share = max(512, total // len(stacks))
    return {rank: text[:share] for rank, text in sorted(stacks.items())[: max(1, total // 512)]}


# -- reading a dump -----------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def where(self, base: Optional[str] = None) -> str:
        return "%s:%d in %s" % (short_path(self.file, base), self.line, self.function)

    def source(self) -> str:
        if self.file.startswith("<"):
            return ""
        return linecache.getline(self.file, self.line).strip()


@dataclass(frozen=True)
class Thread:
    ident: str
    current: bool
    frames: Tuple[Frame, ...]  # innermost first, as faulthandler prints them


def parse(text: str) -> List[Thread]:
    threads: List[Thread] = []
    header: Optional[Tuple[str, bool]] = None
    frames: List[Frame] = []
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            if header is not None:
                threads.append(Thread(header[0], header[1], tuple(frames)))
            header = (head.group("ident") or "", head.group("current") == "Current thread")
            frames = []
            continue
        frame = _FRAME.match(line)
        if frame and header is not None:
            frames.append(Frame(frame.group("file"), int(frame.group("line")), frame.group("func")))
    if header is not None:
        threads.append(Thread(header[0], header[1], tuple(frames)))
    return threads


def main_thread(threads: Iterable[Thread]) -> Optional[Thread]:
    """The thread that runs the user's script or function. Threads started
    with ``threading`` begin in its ``_bootstrap``; the main thread does not,
    and it runs a module's top level somewhere down its stack. Failing both,
    the thread that took the signal (the main one, unless it blocks it)."""
    listed = [t for t in threads if t.frames]
    own = [t for t in listed if not _started_by_threading(t)]
    for pool in (own, listed):
        for thread in pool:
            if any(f.function == "<module>" for f in thread.frames):
                return thread
    if len(own) == 1:
        return own[0]
    current = [t for t in listed if t.current]
    chosen = current or own or listed
    return chosen[0] if chosen else None


def _started_by_threading(thread: Thread) -> bool:
    outer = thread.frames[-1]
    return outer.function == "_bootstrap" and os.path.basename(outer.file) == "threading.py"


_LIBRARY_ROOTS = tuple(
    os.path.realpath(p) + os.sep
    for p in {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    if p
)
_OURS = os.path.dirname(os.path.realpath(__file__)) + os.sep


def is_user_frame(frame: Frame) -> bool:
    """The user's code: not Python's library, not an installed package, not
    this package. (An installed package of the user's own counts as library.)"""
    path = frame.file
    if path.startswith("<") or "site-packages" + os.sep in path or "dist-packages" + os.sep in path:
        return False
    real = os.path.realpath(path)
    return not (real.startswith(_OURS) or real.startswith(_LIBRARY_ROOTS))


_PACKAGE = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep  # all of @torchrun


# What ranks run as their program (preflight="full"'s collective job): where
# such a rank is, is news to the user, and is said as for a script of theirs.
_PROGRAMS = ("collective_check.py",)


def _is_ours(frame: Frame) -> bool:
    """A frame of @torchrun's own plumbing around the rank's program."""
    if frame.file.startswith("<") or os.path.basename(frame.file) in _PROGRAMS:
        return False
    return os.path.realpath(frame.file).startswith(_PACKAGE)


def short_path(path: str, base: Optional[str] = None) -> str:
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in path:
            return path.split(marker, 1)[1]
    base = base or os.getcwd()
    try:
        rel = os.path.relpath(path, base)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


# -- the failure message --------------------------------------------------------------


# -- a rank still importing -------------------------------------------------------------

_IMPORT_STATEMENT = re.compile(r"^\s*(?:from\s+(?P<from>[A-Za-z_][\w.]*)\s+import\b|import\s+(?P<import>[A-Za-z_][\w.]*))")
_DOTTED = re.compile(r"^[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*$")


def is_import_frame(frame: Frame) -> bool:
    """A frame of Python's import machinery (frozen, or from source on builds
    that do not freeze it)."""
    path = frame.file.replace(os.sep, "/")
    return path.startswith("<frozen importlib.") or path.endswith(
        ("/importlib/_bootstrap.py", "/importlib/_bootstrap_external.py"))


def module_name(path: str) -> Optional[str]:
    """The dotted name of a library module from its file: ``.../site-packages/
    torch/nn/__init__.py`` -> ``torch.nn``. None for the user's own files (their
    name depends on ``sys.path``) and for anything that is not a ``.py`` file."""
    rel = None
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in path:
            rel = path.split(marker, 1)[1]
            break
    if rel is None:
        real = os.path.realpath(path)
        root = next((r for r in _LIBRARY_ROOTS if real.startswith(r)), None)
        rel = real[len(root):] if root else None
    if rel is None or not rel.endswith(".py"):
        return None
    parts = rel[: -len(".py")].split(os.sep)
    if parts[-1] == "__init__":
        parts.pop()
    name = ".".join(parts)
    return name if _DOTTED.match(name) else None


def imported_module(statement: str) -> Optional[str]:
    """The module an ``import`` line names: ``import a.b as c`` -> ``a.b``,
    ``from a.b import c`` -> ``a.b``. None for anything else (relative imports
    included: their package is not in the line)."""
    found = _IMPORT_STATEMENT.match(statement or "")
    if not found:
        return None
    return found.group("from") or found.group("import")


def importing(frames: Tuple[Frame, ...], inward_of: int) -> Optional[str]:
    """The module a thread is importing, when the innermost import in progress
    lies inward of frame ``inward_of`` (frames innermost first): the rank's own
    code waits on that import. Named by the module's own frame when it runs
    Python (a library's file), else by the line that imported it (the import
    machinery is innermost: an extension module loading, a module lock)."""
    first = next((i for i, f in enumerate(frames[:inward_of]) if is_import_frame(f)), None)
    if first is None:
        return None
    last = first
    while last + 1 < len(frames) and is_import_frame(frames[last + 1]):
        last += 1
    inner = frames[first - 1] if first > 0 and frames[first - 1].function == "<module>" else None
    importer = frames[last + 1] if last + 1 < len(frames) else None
    by_line = imported_module(importer.source()) if importer is not None else None
    by_path = module_name(inner.file) if inner is not None else None
    name = by_path or by_line
    if name is None and inner is not None:
        name = os.path.splitext(os.path.basename(inner.file))[0]
    return name or "a module"


@dataclass(frozen=True)
class RankWhere:
    """One rank's place, compact: its innermost user frame and below it."""

    rank: int
    user: Optional[Frame]
    innermost: Optional[Frame]
    threads: int
    # The module being imported when the rank's code waits on an import
    # (``importing``): the import machinery's own frames say nothing useful.
    importing: Optional[str] = None
    # Read before the rank finished its dump (``UNFINISHED``): its outer frames are missing.
    unfinished: bool = False

    def place(self, base: Optional[str] = None) -> Tuple[str, ...]:
        """What the message says of it, without the rank: ranks at the same
        place are told once."""
        if self.user is None and self.innermost is None:
            return ("its stack dump was not finished in time" if self.unfinished else "no Python frame in its dump",)
        out = self._importing(base) if self.importing is not None else self._at(base)
        if self.unfinished:
            out.append("    (from a dump it had not finished in time: its outer frames are missing)")
        return tuple(out)

    def _importing(self, base: Optional[str]) -> List[str]:
        out = ["importing %s" % self.importing]
        if self.user is not None:
            code = self.user.source()
            out.append("    from %s%s" % (self.user.where(base), ": %s" % code if code else ""))
        return out

    def _at(self, base: Optional[str]) -> List[str]:
        top = self.user or self.innermost
        assert top is not None
        if self.user is None and _is_ours(top):  # stopped as it started or ended: our frame says nothing to the user
            return ["outside your script, in @torchrun's own start or end of the rank (%s.%s)"
                    % (os.path.splitext(os.path.basename(top.file))[0], top.function)]
        code = top.source()
        out = [top.where(base) + (": %s" % code if code else "")]
        if self.innermost is not None and self.innermost != top:
            out.append("    innermost: %s" % self.innermost.where(base))
        return out

    def lines(self, base: Optional[str] = None) -> List[str]:
        first, *rest = self.place(base)
        return ["rank %d: %s" % (self.rank, first)] + rest


def where(rank: int, text: str) -> RankWhere:
    threads = parse(text)
    thread = main_thread(threads)
    frames = thread.frames if thread is not None else ()
    at = next((i for i, f in enumerate(frames) if is_user_frame(f)), len(frames))
    user = frames[at] if at < len(frames) else None
    return RankWhere(rank, user, frames[0] if frames else None, len(threads), importing(frames, at),
                     unfinished=text.startswith(UNFINISHED))


def group(stacks: Mapping[int, str], base: Optional[str] = None) -> List[Tuple[Tuple[str, ...], List[int]]]:
    """Ranks by place, the odd ones out first (smallest groups, then lowest rank)."""
    places: Dict[Tuple[str, ...], List[int]] = {}
    for rank in sorted(stacks):
        places.setdefault(where(rank, stacks[rank]).place(base), []).append(rank)
    return sorted(places.items(), key=lambda item: (len(item[1]), item[1][0]))


def summarize(stacks: Mapping[int, str], base: Optional[str] = None, limit: int = SUMMARY_PLACES,
              full: str = "the card and the result record") -> str:
    """The few lines of a failure message: where the ranks were, grouped by
    place, at most ``limit`` places (about 30 lines, whatever the gang's size)."""
    if not stacks:
        return ""
    groups = group(stacks, base)
    lines = ["Where the ranks were when they were stopped (innermost frame of your code first; odd ones out "
             "first; every rank's full stack: %s):" % full]
    for place, ranks in groups[:limit]:
        label = "rank %d" % ranks[0] if len(ranks) == 1 else "ranks %s (%d)" % (numbers(ranks), len(ranks))
        lines.append("  %s: %s" % (label, place[0]))
        lines.extend("  " + line for line in place[1:])
    rest = groups[limit:]
    if rest:
        lines.append("  ... and %d more places (%d ranks)" % (len(rest), sum(len(r) for _, r in rest)))
    return "\n".join(lines)


def parse_wire(value: object, max_ranks: int = 4096) -> Dict[int, str]:
    """Stacks as a peer sent them: rank -> text, checked entry by entry."""
    out: Dict[int, str] = {}
    if not isinstance(value, dict):
        return out
    for key, text in list(value.items())[:max_ranks]:
        try:
            rank = int(key)
        except (TypeError, ValueError):
            continue
        if 0 <= rank < 1 << 31 and isinstance(text, str):
            out[rank] = text[:MAX_STACK_BYTES]
    return out
