"""Exporters: the formats `autotune cache export --format` writes, one module each, found through
REGISTRY. The CLI reads each exporter's name, help and options from here; a new format is one module
defining an `Exporter` and one line in REGISTRY (tests/test_exporters.py checks both).

An exporter module stays light to import (the CLI loads every one to build its options): the
export body is imported inside `export`."""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Protocol

#: format name -> "module:attribute" of its Exporter, in the order `--format` lists them (the first
#: is the default)
REGISTRY: dict[str, str] = {
    "sqlite": "autotune.integrations.exporters.portable:SQLITE",
    "json": "autotune.integrations.exporters.portable:JSON",
    "flashinfer": "autotune.integrations.exporters.flashinfer:FLASHINFER",
}


class ExportRefused(ValueError):
    """A refused export (bad option, nothing to export), with a one-line message for the user."""


@dataclass(frozen=True)
class Option:
    """A command-line option of one format (passed to its `export` by `dest`)."""

    flag: str                       # "--flashinfer-version"
    dest: str                       # the keyword `export` receives
    help: str
    is_flag: bool = False
    multiple: bool = False
    metavar: str | None = None

    def default(self) -> Any:
        return False if self.is_flag else () if self.multiple else None


@dataclass(frozen=True)
class Request:
    """What every format is given: the cache to read (opened read-only on demand), the output path
    and the common selections (GPU, the problems of --model), and the signing key file given."""

    open_store: Callable[[], Any]
    output: str | os.PathLike
    gpu: str | None
    problem_keys: list[str] | None
    sign_key: str | None
    include_predicted: bool = False  # predicted winners (--strategy predict: never timed) too


class Exporter(Protocol):
    name: str
    help: str                        # a phrase for --format's help
    options: tuple[Option, ...]

    def export(self, req: Request, **options: Any) -> list[str]:
        """Write the file; the lines to print. Raises ExportRefused for a refused export."""


def get(name: str) -> Exporter:
    module, _, attr = REGISTRY[name].partition(":")
    ex = getattr(importlib.import_module(module), attr)
    if ex.name != name:
        raise TypeError(f"exporter {REGISTRY[name]} is named {ex.name!r}, registered as {name!r}")
    return ex


def names() -> list[str]:
    return list(REGISTRY)


def all_options() -> list[tuple[str, Option]]:
    """(format, option) of every format, in registry order."""
    return [(n, o) for n in REGISTRY for o in get(n).options]


def check_options(fmt: str, given: dict[str, Any]) -> None:
    """Refuse options of another format (their value differs from the option's default)."""
    for n, o in all_options():
        if n != fmt and given.get(o.dest, o.default()) not in (o.default(), None):
            flags = [x.flag for x in get(n).options]
            listed = ", ".join(flags[:-1]) + " and " + flags[-1] if len(flags) > 1 else flags[0]
            raise ExportRefused(f"{listed} need{'s' if len(flags) == 1 else ''} --format {n}")


def export(fmt: str, req: Request, given: dict[str, Any]) -> list[str]:
    """Check the options and run the format's export: the lines to print."""
    check_options(fmt, given)
    ex = get(fmt)
    return ex.export(req, **{o.dest: given.get(o.dest, o.default()) for o in ex.options})
