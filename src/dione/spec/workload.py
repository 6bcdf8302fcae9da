"""A workload: the tasks to train together, a grid helper and the workload-file loader."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import itertools
import os
import re
import sys
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

from dione.spec.task import Task

__all__ = [
    "Workload",
    "WorkloadFileError",
    "grid",
    "import_workload_file",
    "load_workload",
    "loaded_workload_files",
]


@dataclass(frozen=True)
class Workload:
    """The tasks dione trains together; order is the user's, names are unique once valid."""

    tasks: tuple[Task, ...]

    def __init__(self, tasks: Iterable[Task]) -> None:
        tasks = tuple(tasks)
        for i, task in enumerate(tasks):  # met later as "'NoneType' has no attribute 'name'"
            if not isinstance(task, Task):
                raise TypeError(
                    f"item {i + 1} of the workload's tasks is {type(task).__name__}"
                    f"{'' if task is None else f' ({task!r:.40})'}, not a dione.Task"
                    + (" (does a function that builds a task lack its `return`?)"
                       if task is None else "") + ": give Task objects only")
        object.__setattr__(self, "tasks", tasks)

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks)

    def __len__(self) -> int:
        return len(self.tasks)

    def names(self) -> list[str]:
        return [t.name for t in self.tasks]

    def task(self, name: str) -> Task:
        """The task called ``name``; a KeyError that lists the names there are."""
        for t in self.tasks:
            if t.name == name:
                return t
        raise KeyError(f"no task named {name!r}; the workload has: {', '.join(self.names())}")


def _format_value(value: Any, axis: Sequence[Any] = ()) -> str:
    """How ``value`` reads in a task's name: a float in six significant digits (1e-3 as
    0.001), unless another value of its ``axis`` reads the same: then in full; a class or
    function by its name (``nn.GELU`` as GELU), a tuple's items joined by ``_`` (Adam's
    betas (0.9, 0.99) as 0.9_0.99); any other character a name cannot hold as ``_``."""
    if isinstance(value, float):
        short = format(value, "g")
        clash = any(isinstance(v, float) and v != value and format(v, "g") == short
                    for v in axis)
        return repr(value) if clash else short
    if isinstance(value, (tuple, list)):
        return "_".join(_format_value(v) for v in value)
    if isinstance(value, functools.partial):
        return "_".join([_format_value(value.func), *map(_format_value, value.args),
                         *(f"{k}={_format_value(v)}" for k, v in value.keywords.items())])
    named = getattr(value, "__name__", None)
    text = named if isinstance(named, str) and callable(value) else str(value)
    text = re.sub(r" at 0x[0-9a-fA-F]+", "", text)  # a default repr's address: per process
    return re.sub(r"[^A-Za-z0-9._=+-]+", "_", text).strip("_") or "_"


_LONGEST_NAME = 100  # what validation takes


def _unique_names(names: list[str]) -> list[str]:
    """``names``, each within the longest a name may be (a long one cut, with a digest of
    the whole), those that read alike numbered in turn (-1, -2, ...) until none do."""
    names = [n if len(n) <= _LONGEST_NAME else
             f"{n[:_LONGEST_NAME - 9]}-{hashlib.sha1(n.encode()).hexdigest()[:8]}"
             for n in names]
    while len(set(names)) < len(names):
        counts, seen = Counter(names), Counter[str]()
        renamed = []
        for name in names:
            if counts[name] > 1:
                seen[name] += 1
                name = f"{name[:_LONGEST_NAME - 4]}-{seen[name]}"
            renamed.append(name)
        names = renamed
    return names


def grid(prefix: str, build: Callable[..., Task], **axes: Sequence[Any]) -> list[Task]:
    """One task per point of the cartesian product of ``axes``.

    ``build(**point)`` returns the task for that point; its name is replaced by
    ``prefix-key1value1-key2value2`` and the point is kept as its hyperparameters:

    >>> grid("digits", make_digits_task, lr=[1e-3, 3e-3], batch_size=[32, 64])  # doctest: +SKIP
    [Task(name='digits-lr0.001-batch_size32', ...), ...]
    """
    if not axes:
        raise ValueError("grid needs at least one axis, e.g. lr=[1e-3, 3e-3]")
    for key, values in axes.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise ValueError(f"grid axis {key!r} must be a non-empty list of values")
    keys = list(axes)
    tasks = []
    for values in itertools.product(*(axes[k] for k in keys)):
        point = dict(zip(keys, values, strict=True))
        task = build(**point)
        if not isinstance(task, Task):
            raise TypeError(f"grid build function returned {type(task).__name__}, not a Task")
        name = "-".join([prefix, *(f"{k}{_format_value(v, axes[k])}"
                                   for k, v in point.items())])
        tasks.append(replace(task, name=name, hyperparameters={**task.hyperparameters, **point}))
    # Values that read alike (two functions of one name, "a b" and "a_b"): numbered.
    return [replace(t, name=name) if name != t.name else t
            for t, name in zip(tasks, _unique_names([t.name for t in tasks]), strict=True)]


# Module name -> (path, the source as it was loaded). A run trains its tasks as their
# file was when it loaded them: workers get that text, not the file as it is now (a
# user growing the sweep's file for `dione add`, or saving a typo, changed or failed
# the slices that started meanwhile).
_LOADED: dict[str, tuple[str, str]] = {}


WORKLOAD_MODULE_PREFIX = "dione_workload_"  # a workload file's module: this, then its digest


def _module_name(file: Path, source: str) -> str:
    """A name of the file's path and text: a file loaded again after an edit is a
    module of its own, so the tasks loaded before keep the functions they had."""
    digest = hashlib.sha1(f"{file.resolve()}\0{source}".encode()).hexdigest()[:12]
    return f"{WORKLOAD_MODULE_PREFIX}{digest}"


def loaded_workload_files() -> dict[str, str]:
    """Module name to path of every workload file loaded in this process."""
    return {name: path for name, (path, _) in _LOADED.items()}


def loaded_workload_sources() -> dict[str, tuple[str, str]]:
    """Module name to (path, source as loaded) of every workload file loaded here."""
    return dict(_LOADED)


def import_workload_file(module_name: str, path: str) -> None:
    """Import a workload file under the module name the launcher gave it (in a worker)."""
    if module_name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise WorkloadFileError(f"cannot import workload file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)


class WorkloadFileError(Exception):
    """A workload file could not be loaded; the message says where and how to fix it."""


@contextlib.contextmanager
def _exit_refused(file: Path) -> Iterator[None]:
    """``os._exit`` while the file loads raises instead of ending the process with no
    word (it ended `dione run` and `dione validate` with status 0)."""
    real = os._exit

    def refused(status: int) -> NoReturn:
        raise WorkloadFileError(f"{file}: called os._exit({status}) while loading; a workload "
                                "file must define `workload`, not end the process")

    os._exit = refused
    try:
        yield
    finally:
        os._exit = real


_DIONE_SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def load_workload(path: str | Path) -> Workload:
    """Import a workload file (a Python file defining ``workload``) and return its workload.

    Worker processes import the same file under the same module name before they read
    their slice (see ``loaded_workload_files``), so the functions it defines travel by
    reference and their tracebacks show the file's own lines; lambdas and closures
    travel by value. Keep the file cheap to import: every worker imports it.
    """
    file = Path(path)
    if file.is_dir():
        raise WorkloadFileError(f"{str(file)!r} is a folder, not a workload file: give the "
                                "Python file that defines `workload`")
    if not file.is_file():
        raise WorkloadFileError(f"workload file {str(file)!r} does not exist")
    try:
        source = file.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise WorkloadFileError(f"{file}: cannot be read: {err}") from None
    module_name = _module_name(file, source)
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise WorkloadFileError(f"{file}: not a Python file; a workload file ends in .py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    folder = str(file.resolve().parent)
    if folder not in sys.path:  # its sibling modules import, as under `python FILE`
        sys.path.insert(0, folder)
    try:
        with _exit_refused(file):  # the text read above, as workers will run it
            exec(compile(source, str(file), "exec"), module.__dict__)
    except SystemExit as err:  # sys.exit at import: no workload, and no silent exit 0
        sys.modules.pop(module_name, None)
        raise WorkloadFileError(f"{file}: called sys.exit({err.code!r}) while loading; a "
                                "workload file must define `workload`, not end the "
                                "process (guard a script's main with "
                                "`if __name__ == '__main__':`)") from None
    except WorkloadFileError:
        sys.modules.pop(module_name, None)
        raise
    except SyntaxError as err:
        sys.modules.pop(module_name, None)
        raise WorkloadFileError(
            f"{file}:{err.lineno}: syntax error: {err.msg}\n    {(err.text or '').rstrip()}"
        ) from None
    except Exception as err:
        sys.modules.pop(module_name, None)
        # The file's line, and the frames outside dione under the message (it said the
        # error twice around dione's own frames, and no line: a review).
        frames = traceback.extract_tb(err.__traceback__)
        line = next((f.lineno for f in reversed(frames) if f.filename == str(file)), None)
        theirs = [f for f in frames if not f.filename.startswith(_DIONE_SOURCE)]
        raise WorkloadFileError(
            f"{file}{'' if line is None else f':{line}'}: raised {type(err).__name__} while "
            f"loading: {err}\nTraceback (most recent call last):\n"
            + "".join(traceback.format_list(theirs))
        ) from None
    _LOADED[module_name] = (str(file.resolve()), source)
    if not hasattr(module, "workload"):
        raise WorkloadFileError(
            f"{file}: defines no `workload`; end the file with e.g. "
            "`workload = Workload([task1, task2])`"
        )
    value = module.workload
    if isinstance(value, Workload):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(t, Task) for t in value):
        return Workload(value)
    raise WorkloadFileError(
        f"{file}: `workload` is a {type(value).__name__}; it must be a dione.Workload "
        "(or a list of dione.Task)"
    )
