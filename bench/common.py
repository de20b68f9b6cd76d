"""What the bench scripts share: an argument parser whose `--help` prints the script's docstring
and creates nothing, and the check that a cache argument names a file that exists (sqlite3 would
create a missing one, a path named `--help` included)."""
from __future__ import annotations

import argparse
import os


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser with the module docstring as its help: first line as description, the rest after."""
    head, _, rest = (doc or "").strip().partition("\n")
    return argparse.ArgumentParser(description=head, epilog=rest.strip() or None,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def existing(path: str) -> str:
    """argparse type: a file that exists (never created by opening it)."""
    if not os.path.isfile(path):
        raise argparse.ArgumentTypeError(f"no such file: {path}")
    return path


def is_sync_warning(w) -> bool:
    """A warning of torch's sync debug mode for one device sync (not its one-time "prototype"
    notice, which also says "synchronizing": counted as a sync on the first forward before)."""
    msg = str(w.message)
    return "synchroniz" in msg and "prototype" not in msg
