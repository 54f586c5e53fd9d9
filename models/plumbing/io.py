"""Plumbing shared by every entry point: atomic file writes, JSON in and out, exclusive locks, memory
bounds, and the CLI error convention (``run_cli``: bad input, a ``UsageError``, is one line on stderr and exit
code 2; a bug is its traceback, a line saying it is a bug, and exit code 1). Standard library only: the
bottom room of ``models``, imported before anything heavy."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import resource
import select
import shutil
import stat
import sys
import tempfile
import traceback
from pathlib import Path

MEMORY_FRACTION = 0.8  # refuse work whose estimated memory exceeds this share of the available memory
MAX_JSON_BYTES = 256 * 2**20  # config, task and key-map files are small; refuse to parse more
MAX_TENSORS = 20_000  # refuse to build a model of more tensors (work, whatever their sizes): 10x the largest LLMs


class UsageError(ValueError):
    """Bad input: a flag, a file, a checkpoint or a size that the user gave and that cannot be used. Every
    entry point prints its message as one line and exits 2 (``run_cli``); any other exception is a bug of the
    suite and is shown as one (exit 1, the traceback). A ``ValueError``, so that a caller from Python who
    catches ``ValueError`` for bad arguments catches it too."""


@contextlib.contextmanager
def input_errors():
    """Inside, a ``ValueError`` is about the input being read (a checkpoint, its config, a spec): it leaves as
    the ``UsageError`` of the same message. For code that validates what it reads with checks written for
    any caller (a network's config, a task's sizes), at the boundary where the user's input comes in."""
    try:
        yield
    except UsageError:
        raise
    except ValueError as e:
        raise UsageError(str(e)) from e


def atomic_write(path: str | Path, write) -> None:
    """``write(tmp_path)`` then rename over ``path``: readers never see a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)  # a missing folder of --json is made, as --out's
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def to_json(obj):
    """``json.dumps(default=to_json)``: tensors and NumPy values become lists or numbers."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj)}")


def write_json(path: str | Path, record) -> None:
    """Write ``record`` (tensors allowed) as indented JSON, atomically."""
    text = json.dumps(record, indent=1, default=to_json) + "\n"
    atomic_write(path, lambda tmp: tmp.write_text(text))


def what_is(path: str | Path) -> str:
    """What ``path`` is, for a message about a path that is not the regular file or folder expected:
    ``does not exist``, ``is a folder``, ``is a named pipe (FIFO)``, ``is a symlink loop``, ..."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "is a symlink loop"
        if path.is_symlink():
            return f"is a symlink to {os.readlink(path)!r}, which does not exist"
        if e.errno == errno.ENOENT:
            return "does not exist"
        return f"cannot be read ({e.strerror or e})"
    kinds = {stat.S_ISDIR: "is a folder", stat.S_ISREG: "is a file", stat.S_ISFIFO: "is a named pipe (FIFO)"}
    kinds.update({stat.S_ISSOCK: "is a socket", stat.S_ISCHR: "is a device", stat.S_ISBLK: "is a device"})
    return next((text for test, text in kinds.items() if test(mode)), "is not a regular file")


def is_utf8(path: str | Path) -> bool:
    """Whether the name of ``path`` is valid UTF-8 (a name the shell allows may not be: ``b"ck\\xff"``)."""
    try:
        os.fsencode(path).decode()
    except UnicodeDecodeError:
        return False
    return True


@contextlib.contextmanager
def openable(path: str | Path):
    """A name of ``path`` that readers needing UTF-8 names (safetensors, torch.load, transformers) can open:
    ``path`` itself, or for a name that is not valid UTF-8, ``/proc/self/fd/N`` of the file or folder opened
    here (Linux), valid while the context lasts."""
    path = Path(path)
    if is_utf8(path):
        yield path
        return
    if not Path("/proc/self/fd").is_dir():
        raise UsageError(f"{str(path)!r} is not valid UTF-8 and this system cannot name it otherwise; rename it")
    fd = os.open(path, os.O_RDONLY)
    try:
        yield Path(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def listing(names, shown: int = 5) -> str:
    """``names`` for a message: the first ``shown``, then ``... and N more`` (a list of 20 000 is one short line)."""
    names = [str(n) for n in names]
    more = f" ... and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


ZIP, PICKLE, SAFETENSORS = "a zip archive (a NumPy .npz or a PyTorch file)", "a pickle", "a safetensors file"
# What a file holds, from its first bytes: (prefix, what it is); the safetensors header is found apart.
MAGIC = (
    (b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"%PDF", "a PDF document"),
    (b"PK\x03\x04", ZIP), (b"PK\x05\x06", "an empty zip archive"),
    (b"\x93NUMPY", "a NumPy .npy array"), (b"\x1f\x8b", "a gzip file"), (b"BZh", "a bzip2 file"),
    (b"\x7fELF", "an executable"), (b"SQLite format 3", "an SQLite database"),
)  # fmt: skip


def file_kind(path: str | Path) -> str | None:
    """What the regular file ``path`` holds, from its first bytes (``MAGIC``, a pickle, a safetensors header),
    for a message about a file that is not what was expected; None when unknown or unreadable."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return None
    kind = next((text for magic, text in MAGIC if head.startswith(magic)), None)
    if kind is None and len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        kind = PICKLE
    if kind is None and len(head) >= 10 and head[8:10] in (b'{"', b"{ ") and int.from_bytes(head[:8], "little") > 0:
        kind = SAFETENSORS
    return kind


def read_small(path: str | Path, what: str) -> bytes:
    """The bytes of the small file ``path`` (a config, a task.json, a key map); a missing, huge or
    unreadable file is one ``UsageError`` naming ``what``, the path and what it is. Every such file is read here."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{what} {str(path)!r} {what_is(path)}; expected a JSON file")
    try:
        size_ = path.stat().st_size
        if size_ > MAX_JSON_BYTES:
            kind = file_kind(path)
            raise UsageError(
                f"{what} {str(path)!r} is {f'{kind}, not JSON,' if kind else 'a file'} of {size(size_)}; expected a "
                f"small JSON file (at most {MAX_JSON_BYTES >> 20} MiB)"
            )
        return path.read_bytes()
    except OSError as e:
        raise UsageError(f"{what} {str(path)!r} cannot be read ({e.strerror or e})") from None


def parse_json(data: bytes, path: str | Path, what: str):
    """``data`` (the bytes of ``path``) parsed as JSON; malformed or too deeply nested is one ``UsageError``
    (naming what the file is when its first bytes say: a PNG, a zip archive, ...)."""
    try:
        return json.loads(data.decode())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        kind = file_kind(path)
        if kind is not None:
            raise UsageError(f"{what} {str(path)!r} is {kind}, not JSON; expected a JSON file") from None
        raise UsageError(f"{what} {str(path)!r} is not valid JSON ({one_line(e)})") from None
    except RecursionError:
        raise UsageError(f"{what} {str(path)!r} is nested too deeply to parse; expected a flat JSON object") from None


def read_json(path: str | Path, what: str):
    """The parsed JSON file ``path`` (``read_small`` then ``parse_json``)."""
    return parse_json(read_small(path, what), path, what)


class Busy(UsageError):
    """Another process holds the lock: not a bug, and nothing to retry at once (one line, exit 2)."""


@contextlib.contextmanager
def exclusive_lock(path: str | Path, wait: bool = True, what: str = "it"):
    """Hold an ``fcntl`` lock on the file ``path`` (created, and removed on release, so no lock file is
    left behind). ``wait=False``: raise ``Busy`` at once if another process holds it. The inode check
    after locking makes removal safe: a waiter that locked a removed file retries on the new one."""
    path = Path(path)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            raise Busy(
                f"another process is writing {what} (it holds the lock {str(path)!r}); wait for it to end"
            ) from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # the holder removed this file while we waited: lock the new one
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


def write_set(folder: str | Path, name: str, writers: dict) -> list[Path]:
    """Write files that belong together (an analysis's figures and JSON) as ONE set: after a crash or a
    kill at any instant, and the next ``write_set``/``recover_set`` of ``name``, ``folder`` holds all of
    the new files or all of the old ones. ``writers[file](path)`` writes ``file`` at ``path``.

    Every file is written into a private staging folder first (an error there leaves the old set
    untouched); then, under a lock on ``name`` (two runs take turns), the staging folder is renamed to
    ``.NAME.ready``, the commit point, and its files are moved into place; an interrupted move is
    finished by the next call (roll forward)."""
    folder = Path(folder)
    blocked = [file for file in writers if (folder / file).is_dir() and not (folder / file).is_symlink()]
    if blocked:  # found before anything is written: a move onto a folder would fail half-way through the set
        raise UsageError(f"cannot write the {name} set in {str(folder)!r}: {listing(blocked)} is a folder; expected a file")
    staging = folder / f".{name}.set-{os.getpid()}-{os.urandom(4).hex()}"
    staging.mkdir()
    try:
        for file, write in writers.items():
            write(staging / file)
            os.chmod(staging / file, 0o644)
        with exclusive_lock(folder / f".{name}.lock", what=f"the {name} set in {str(folder)!r}"):
            _recover_set(folder, name)
            os.rename(staging, _ready(folder, name))  # from here on the new set is the one to finish
            _roll_forward(folder, _ready(folder, name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [folder / file for file in writers]


def recover_set(folder: str | Path, name: str) -> None:
    """Finish a ``write_set`` of ``name`` that was killed while moving its files, and remove the staging
    folders of runs that are no longer alive."""
    folder = Path(folder)
    with exclusive_lock(folder / f".{name}.lock", what=f"the {name} set in {str(folder)!r}"):
        _recover_set(folder, name)


def _ready(folder: Path, name: str) -> Path:
    return folder / f".{name}.ready"


def _roll_forward(folder: Path, ready: Path) -> None:
    for f in sorted(ready.iterdir()):
        os.replace(f, folder / f.name)
    ready.rmdir()


def _recover_set(folder: Path, name: str) -> None:
    if _ready(folder, name).is_dir():
        _roll_forward(folder, _ready(folder, name))
    for staging in folder.glob(f".{name}.set-*"):
        pid = staging.name[len(f".{name}.set-") :].split("-")[0]
        if not pid.isdigit() or not _alive(int(pid)):
            shutil.rmtree(staging, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def memory_limit(device: str | None = None) -> tuple[int, str]:
    """(bytes a new allocation on ``device`` may take, what bounds it). A CUDA device: its free memory
    (``torch.cuda.mem_get_info``). The CPU: the least of the memory the system has free
    (``MemAvailable``; physical memory if unknown), what this process's address-space limit leaves
    (``ulimit -v``, ``RLIMIT_AS``, less the address space already mapped) and what its cgroup leaves
    (``_cgroup_left``)."""
    if isinstance(device, str) and device.startswith("cuda"):
        import torch

        with contextlib.suppress(RuntimeError, AssertionError, ValueError):
            return torch.cuda.mem_get_info(torch.device(device))[0], f"the free memory of {device}"
    limits = [(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "the physical memory")]
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                limits = [(int(line.split()[1]) * 1024, "the memory free (MemAvailable)")]
    with contextlib.suppress(OSError, ValueError):
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            mapped = next(
                int(line.split()[1]) * 1024
                for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("VmSize:")
            )
            limits.append((max(soft - mapped, 0), "what the address-space limit (ulimit -v) leaves"))
    left = _cgroup_left()
    if left is not None:
        limits.append((left, "what the cgroup's memory limit leaves"))
    return min(limits)


def _cgroup_left() -> int | None:
    """Bytes this process's cgroup may still take (v2 ``memory.max - memory.current``, v1
    ``memory.limit_in_bytes - memory.usage_in_bytes``), or None without a limit."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        v2 = Path("/sys/fs/cgroup") / next(
            line.split("::", 1)[1].strip().lstrip("/")
            for line in Path("/proc/self/cgroup").read_text().splitlines()
            if line.startswith("0::")
        )
        if (v2 / "memory.max").is_file():
            limit = (v2 / "memory.max").read_text().strip()
            return None if limit == "max" else max(int(limit) - int((v2 / "memory.current").read_text()), 0)
    with contextlib.suppress(OSError, ValueError):
        v1 = Path("/sys/fs/cgroup/memory")
        limit = int((v1 / "memory.limit_in_bytes").read_text())
        if limit < 2**62:  # no limit reads as the largest page-aligned int64
            return max(limit - int((v1 / "memory.usage_in_bytes").read_text()), 0)
    return None


def available_memory() -> int:
    """Bytes of memory available to a new allocation (``memory_limit``)."""
    return memory_limit()[0]


def size(n: float) -> str:
    """``n`` bytes, human readable."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000:
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.3g} PB"


def check_memory(needed: float, what: str, device: str | None = None) -> None:
    """One-line ``UsageError`` if ``needed`` bytes exceed ``MEMORY_FRACTION`` of the available memory
    on ``device`` (default the CPU; ``memory_limit``): what was asked (``what``), how much it needs, what
    is available. Every size check of the suite ends here, before the allocation it sizes."""
    available, source = memory_limit(device)
    bound = MEMORY_FRACTION * available
    if needed > bound:
        raise UsageError(
            f"{what} would need about {size(needed)}, more than the bound of {size(bound)} "
            f"({MEMORY_FRACTION:.0%} of {size(available)}, {source}); use smaller sizes"
        )


def check_tensors(count: float, what: str) -> None:
    """One-line ``UsageError`` if building a model would make more than ``MAX_TENSORS`` tensors: the work
    of building (one Python object per tensor) grows with the count even where each tensor is tiny."""
    if count > MAX_TENSORS:
        raise UsageError(
            f"{what} would build about {count:.3g} tensors, more than the bound of {MAX_TENSORS} "
            f"(the largest published models have a few thousand); use fewer layers"
        )


def tensor_bytes(shape, itemsize: int) -> int:
    """Bytes of a dense tensor of ``shape`` (integers) and ``itemsize``, by arithmetic (nothing allocated)."""
    return math.prod(int(n) for n in shape) * itemsize


def one_line(e: BaseException | str) -> str:
    """An error message on one line: newlines escaped (a path may hold one), at most 500 characters;
    an empty message is the exception's type name."""
    text = str(e).strip()
    if not text and isinstance(e, BaseException):
        text = type(e).__name__
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    text = text.encode("utf-8", "backslashreplace").decode()  # a name that is not UTF-8: its bytes escaped
    return text if len(text) <= 500 else text[:497] + "..."


def describe(e: BaseException) -> str:
    """One line for an exception that is not a bug of the suite: a ``UsageError``'s message; what the system
    refused (an ``OSError``: disk full, permission denied, ...; memory exhausted)."""
    if isinstance(e, UsageError):
        return one_line(e)
    if isinstance(e, OSError) and e.strerror:
        name = f" {e.filename!r}" if e.filename is not None else ""
        return one_line(f"{e.strerror}{name}")
    if isinstance(e, MemoryError):
        return "out of memory; use smaller sizes"
    return one_line(f"{type(e).__name__}: {e}" if str(e).strip() else type(e).__name__)


# Thread counts torch's OpenMP reads when it loads: a malformed one makes libgomp print its own lines.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
BUG_REPORTS = "the maintainers of causal-icl-probes (the repository's issue tracker), with the command and the traceback"


def check_environment() -> None:
    """One ``UsageError`` for a malformed ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` (not positive integers,
    comma-separated). ``run_cli`` calls it before the command runs, so an entry point that parses its flags
    before importing torch (every one of ours) refuses before libgomp could print its own lines."""
    for name in THREAD_VARIABLES:
        value = os.environ.get(name)
        if value is not None and not all(v.strip().isdigit() and int(v) > 0 for v in value.split(",")):
            raise UsageError(
                f"environment variable {name}={value!r} is not a positive integer; unset it (--threads sets torch's threads)"
            )


OUT_OF_MEMORY = ("DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory",
                 "out of memory")  # torch's allocators' words (torch.OutOfMemoryError is a RuntimeError)


def not_a_bug(e: BaseException) -> bool:
    """Whether ``e`` is bad input (``UsageError``) or the system refusing (an ``OSError`` with its reason,
    ``MemoryError``, an allocator of torch out of memory): one line and exit 2. Anything else is a bug."""
    if isinstance(e, RuntimeError) and any(words in str(e) for words in OUT_OF_MEMORY):
        return True
    return isinstance(e, (UsageError, MemoryError)) or (isinstance(e, OSError) and bool(e.strerror))


SUITE_MODELS = Path(__file__).resolve().parents[1]  # this suite's models/ package
_warned_shadow: list[str] = []


def warn_if_models_shadowed() -> str | None:
    """One line on stderr (once a process) when the top-level ``models`` Python imported is not this suite's:
    a project folder with a ``models/`` of its own, first on ``sys.path``, shadows it (the suite's submodules
    still load, but ``models.load_subject`` and the other top-level names are missing). Returns the line."""
    found = getattr(sys.modules.get("models"), "__file__", None)
    if found is None or Path(found).resolve().parent == SUITE_MODELS or _warned_shadow:
        return None
    _warned_shadow.append(
        f"warning: the `models` package imported is {Path(found).parent}, not this suite's ({SUITE_MODELS}), so "
        "`models.load_subject` and the other top-level names are missing; run from another folder, run "
        "`python -P -m ...` (the current folder is then not first on sys.path), or import from the submodules "
        "(from models.interp.subject import load_subject)"
    )
    print(_warned_shadow[0], file=sys.stderr)
    return _warned_shadow[0]


def run_cli(main, argv: list[str] | None = None, prog: str | None = None):
    """Run a CLI ``main(argv)``. Bad input (a ``UsageError``) or the system refusing (``not_a_bug``) becomes
    ``PROG: error: <one line>`` on stderr (``prog``, e.g. ``python -m models.train``, as argparse's errors
    begin) and exit code 2; ``--debug`` in argv shows its traceback as well. Any other exception is a bug:
    its traceback, a line saying so and where to report it, and exit code 1. ``KeyboardInterrupt`` exits 130
    with one line. A reader of stdout that went away (``| head``) ends the run quietly: what it wrote is
    written. The environment is checked first (``check_environment``)."""
    args = sys.argv[1:] if argv is None else list(argv)
    error = "error:" if prog is None else f"{prog}: error:"
    with contextlib.suppress(AttributeError, ValueError):  # a path that is not UTF-8 prints as its own bytes
        sys.stdout.reconfigure(errors="surrogateescape")
    try:
        try:
            check_environment()
            result = main(args)
            sys.stdout.flush()
            return result
        except BrokenPipeError:
            if not _stdout_gone():
                raise  # another pipe (a child process's): an error like any other
            _quiet_stdout()
            return None
    except KeyboardInterrupt as e:  # its message, if any, says what was kept
        print(f"{error} interrupted{': ' + str(e) if str(e) else ''}", file=sys.stderr)
        raise SystemExit(130) from None
    except Exception as e:
        if not_a_bug(e):
            if "--debug" in args:
                traceback.print_exc()
            print(f"{error} {describe(e)}", file=sys.stderr)
            raise SystemExit(2) from None
        traceback.print_exc()
        print(
            f"{error} this is a bug in causal-icl-probes, not a problem with your input ({one_line(f'{type(e).__name__}: {e}')}); "
            f"please report it to {BUG_REPORTS}",
            file=sys.stderr,
        )
        raise SystemExit(1) from None


def _stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports an error on its write end)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    return False


def _quiet_stdout() -> None:
    """stdout's reader has gone: point stdout at /dev/null, so that the flush at exit cannot fail again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def name_too_long(path: str | Path) -> str | None:
    """The first component of ``path`` over the file system's name limit (255 bytes), or None."""
    for part in Path(path).parts:
        if len(os.fsencode(part)) > 255:
            return part
    return None
