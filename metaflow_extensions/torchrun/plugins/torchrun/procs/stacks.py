"""Where every rank was when the gang stopped: the Python stack of its main thread.

faulthandler writes from a C signal handler, so a rank stuck in a collective or
any C call still answers, with no ptrace, py-spy or help from the user's code.
Only the main thread, by itself (``tgkill``): asked for every thread,
faulthandler walks frames that run on, and a frame freed under it crashed the
rank or cut its dump short. A dump is known whole by its last line, the main
thread's outermost frame, which the rank writes at the top of its file
(``ending``); one not whole in time is kept, marked ``UNFINISHED``.
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

from ..host.proctree import signal_main_thread
from .names import STACKS_SUFFIX, rank_file
from .ranges import numbers
from ..base import timeouts

# Real-time: SIGUSR1/2 belong to user code. Unhandled it kills a rank, so the
# bootstrap registers it before the user's code runs.
STACK_SIGNAL = signal.SIGRTMIN + 3
MAX_STACK_BYTES = 16 * 1024
SUMMARY_PLACES = 12  # places in the failure message; the card shows every rank

_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
_THREAD = re.compile(r"^(?P<current>Current thread|Thread) (?P<ident>0x[0-9a-fA-F]+)|^Stack \(most recent")


def stack_path(directory: str, rank: int) -> str:
    return rank_file(directory, rank, STACKS_SUFFIX)


# A stack file's first line: this, then the file and function every dump ends with.
_ENDS_WITH = "# each dump ends with the frame of"
# faulthandler's end of a dump cut short: past 100 frames, or no Python frame left.
_SHORT_ENDS = ("  ...", "  <no Python frame>")
UNFINISHED = "<unfinished: the rank had not written the rest of this dump when it was read>"
# faulthandler writes at most this many characters of a name, then "...".
_NAME_CHARS = 500


def ending(frame: FrameType) -> Tuple[str, str]:
    """The outermost frame's file and function, as faulthandler prints them:
    it stays while the rank runs, so every dump of the main thread ends with it."""
    while frame.f_back is not None:
        frame = frame.f_back
    return escaped(frame.f_code.co_filename), escaped(frame.f_code.co_name)


def escaped(text: str) -> str:
    """A name as faulthandler writes it."""
    return "".join(_escape(ch) for ch in text[:_NAME_CHARS]) + ("..." if len(text) > _NAME_CHARS else "")


def _escape(ch: str) -> str:
    code = ord(ch)
    if 32 <= code <= 126:
        return ch
    return "\\x%02x" % code if code <= 0xFF else "\\u%04x" % code if code <= 0xFFFF else "\\U%08x" % code


def register(directory: Optional[str], rank: int) -> Optional[IO[str]]:
    """The caller keeps the returned file alive: faulthandler writes to its descriptor."""
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
        faulthandler.register(STACK_SIGNAL, file=out, all_threads=False, chain=False)
    except (OSError, ValueError, RuntimeError):
        out.close()
        return None
    return out


def collect(directory: str, pids: Mapping[int, int], seconds: float = timeouts.COLLECT_SECONDS) -> Dict[int, str]:
    """Each live rank's dump (rank -> pid), read back once whole; a rank that
    wrote nothing within ``seconds`` is left out."""
    # rank -> its file, where the dump begins, its end
    asked: Dict[int, Tuple[str, int, Optional[Tuple[str, str]]]] = {}
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
    """None for a file the rank did not begin: a dump in it is whole only when cut short."""
    head = _read_from(path, 0).split("\n", 1)[0].split("\t")
    return (head[1], head[2]) if len(head) == 3 and head[0] == _ENDS_WITH else None


def _whole(tail: str, ends: Optional[Tuple[str, str]]) -> bool:
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
    """Stacks cut to ``total`` characters in all, each keeping its innermost frames."""
    if not stacks:
        return {}
    share = max(512, total // len(stacks))
    return {rank: text[:share] for rank, text in sorted(stacks.items())[: max(1, total // 512)]}


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def where(self, base: Optional[str] = None) -> str:
        return "%s:%d in %s" % (short_path(self.file, base), self.line, self.function)

    def source(self) -> str:
        return "" if self.file.startswith("<") else linecache.getline(self.file, self.line).strip()


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
    """The thread that runs the user's code: not begun by ``threading``, a
    module's top level down its stack; failing both, the one that took the signal."""
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
    """Not Python's library, an installed package or this package."""
    path = frame.file
    if path.startswith("<") or "site-packages" + os.sep in path or "dist-packages" + os.sep in path:
        return False
    real = os.path.realpath(path)
    return not (real.startswith(_OURS) or real.startswith(_LIBRARY_ROOTS))


_PACKAGE = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep  # all of @torchrun


# Our programs a rank runs (preflight="full"): said as for a script of the user's.
_PROGRAMS = ("collective_check.py",)


def _in_package(frame: Frame) -> bool:
    return not frame.file.startswith("<") and os.path.realpath(frame.file).startswith(_PACKAGE)


def _is_ours(frame: Frame) -> bool:
    return _in_package(frame) and os.path.basename(frame.file) not in _PROGRAMS


def _in_packages(path: str) -> Optional[str]:
    """The path below site-packages or dist-packages, if it is there."""
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in path:
            return path.split(marker, 1)[1]
    return None


def short_path(path: str, base: Optional[str] = None) -> str:
    packaged = _in_packages(path)
    if packaged is not None:
        return packaged
    base = base or os.getcwd()
    try:
        rel = os.path.relpath(path, base)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


_IMPORT_STATEMENT = re.compile(
    r"^\s*(?:from\s+(?P<from>[A-Za-z_][\w.]*)\s+import\b|import\s+(?P<import>[A-Za-z_][\w.]*))")
_DOTTED = re.compile(r"^[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*$")


def is_import_frame(frame: Frame) -> bool:
    """Python's import machinery, frozen or from source."""
    path = frame.file.replace(os.sep, "/")
    return path.startswith("<frozen importlib.") or path.endswith(
        ("/importlib/_bootstrap.py", "/importlib/_bootstrap_external.py"))


def module_name(path: str) -> Optional[str]:
    """A library module's dotted name from its file; None for the user's own
    files (their name depends on ``sys.path``)."""
    rel = _in_packages(path)
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
    """``import a.b as c`` and ``from a.b import c`` -> ``a.b``; None for a relative import."""
    found = _IMPORT_STATEMENT.match(statement or "")
    return (found.group("from") or found.group("import")) if found else None


def importing(frames: Tuple[Frame, ...], inward_of: int) -> Optional[str]:
    """The module the user's code (frame ``inward_of``) waits to import: named by
    its own frame where it runs Python, else by the line that imported it."""
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
    rank: int
    user: Optional[Frame]
    innermost: Optional[Frame]
    threads: int
    importing: Optional[str] = None  # the module the rank's code waits on (``importing``)
    unfinished: bool = False

    def place(self, base: Optional[str] = None) -> Tuple[str, ...]:
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
    innermost = frames[0] if frames else None
    if user is None:  # in our own start, end or program, maybe inside a library it called (torch's error file)
        innermost = next((f for f in frames if _in_package(f)), innermost)
    return RankWhere(rank, user, innermost, len(threads), importing(frames, at),
                     unfinished=text.startswith(UNFINISHED))


def group(stacks: Mapping[int, str], base: Optional[str] = None) -> List[Tuple[Tuple[str, ...], List[int]]]:
    """Ranks by place, the odd ones out first (smallest groups, then lowest rank)."""
    places: Dict[Tuple[str, ...], List[int]] = {}
    for rank in sorted(stacks):
        places.setdefault(where(rank, stacks[rank]).place(base), []).append(rank)
    return sorted(places.items(), key=lambda item: (len(item[1]), item[1][0]))


def summarize(stacks: Mapping[int, str], base: Optional[str] = None, limit: int = SUMMARY_PLACES,
              full: str = "the card and the result record") -> str:
    """At most ``limit`` places, whatever the gang's size."""
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

