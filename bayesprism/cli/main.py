"""``bayesprism`` entry point: dispatches to one module per sub-command.

Each sub-command module defines ``register(subparsers)`` which adds its parser and sets
``func=run`` where ``run(args) -> int`` returns the exit code. Exit codes (DESIGN §8): 0 success,
2 bad input (one line per problem, no traceback), 1 internal failure, 3 strict-mode failure.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings

from bayesprism._version import __version__
from bayesprism.errors import BayesPrismError, InputError
from bayesprism.outputs import Terminated, terminate_as_exception

#: Sub-commands in the order shown by ``--help`` (module ``bayesprism.cli.<name>``).
SUBCOMMANDS = (
    "ingest",
    "simulate",
    "fit",
    "diagnose",
    "forecast",
    "report",
    "validate",
    "sensitivity",
    "place",
    "learn_prior",
    "what_if",
    "demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bayesprism",
        description="Forecast step time and training time of distributed training runs, "
        "with credible intervals, from measured traces.",
    )
    parser.add_argument("--version", action="version", version=f"bayesprism {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"bayesprism.cli.{name}").register(sub)
    return parser


#: Earlier spellings of options, still accepted for one release (issue 18: one name per
#: concept): old -> new.
RENAMED_OPTIONS: dict[str, str] = {"--seed": "--random-seed", "--out": "--output",
                                   "--model": "--spec"}


def _warn_renamed_options(argv: list[str]) -> None:
    """A FutureWarning, in the command's warning summary, for each earlier option spelling."""
    for old, new in RENAMED_OPTIONS.items():
        if any(arg == old or arg.startswith(old + "=") for arg in argv):
            warnings.warn(f"{old} is now {new}; the old spelling goes in the next release",
                          FutureWarning, stacklevel=2)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    quiet = bool(getattr(args, "quiet", False))
    # the console script guards its main module, so trace files may be read by worker
    # processes (bayesprism.ingest.dispatch.ingest_workers); only for this command
    chosen = "BAYESPRISM_INGEST_WORKERS" in os.environ
    if not chosen:
        os.environ["BAYESPRISM_INGEST_WORKERS"] = "auto"
    # every command's warnings are gathered and printed once at its end, de-duplicated, with
    # what to do (never interleaved with progress bars); --quiet prints none
    caught: list = []
    try:
        # the filters stay as they are (library deprecations remain hidden)
        # kill/SIGTERM as an exception: atomic writes remove their temporaries on the way out
        with warnings.catch_warnings(record=True) as caught, terminate_as_exception():
            _warn_renamed_options(sys.argv[1:] if argv is None else argv)
            return int(args.func(args) or 0)
    except InputError as exc:
        for line in exc.lines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, FileExistsError,
            PermissionError) as exc:
        print(f"error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    except BayesPrismError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Terminated as exc:
        print(f"terminated by signal {exc.signum}", file=sys.stderr)
        return int(exc.code)
    finally:
        if not chosen:
            os.environ.pop("BAYESPRISM_INGEST_WORKERS", None)
        if not quiet:
            from bayesprism.cli._common import print_warnings

            print_warnings(caught)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
