"""One error style for every command: one line on stderr naming the input and the cause, exit code 2.

    $ memorywalker sft --config c.toml data=missing.jsonl
    memorywalker sft: error: missing.jsonl: No such file or directory
    $ memorywalker --debug sft ...          # the same failure with its traceback

Bad input exits 2: an :class:`~memorywalker.errors.InputError` (raised where a config value, a record,
a request or a file is judged: ConfigError, RecordError and the rest are InputErrors), a pydantic
validation error, a file that does not parse (TOML, JSON, UTF-8), an OSError (a missing or unreadable
file, a full disk, an engine or server that cannot be reached) and a usage error. Anything else — a
plain ``ValueError`` from an internal check, a ``KeyError``, a ``TypeError`` — is a bug: it is also one
line, with its exception type and "a bug? rerun with --debug for the traceback", and exits 1.
``--debug`` (anywhere on the command line) or ``MEMORYWALKER_DEBUG=1`` re-raises with the traceback.

    $ memorywalker validate data.jsonl        # a bug in an internal check
    memorywalker validate: error: ValueError: ... (a bug? rerun with --debug for the traceback)
"""

from __future__ import annotations

import json
import os
import sys

import pydantic
import typer
from typer.core import TyperGroup

from memorywalker.errors import InputError

INPUT_ERROR = 2
INTERNAL_ERROR = 1


# What the user can fix: judged input, and files that do not parse as what they claim to be (TOML's
# error is matched by name: tomllib on Python 3.11+, tomli before).
INPUT_ERRORS = (OSError, InputError, pydantic.ValidationError, json.JSONDecodeError, UnicodeDecodeError)


def _input_error(e: BaseException) -> bool:
    return isinstance(e, INPUT_ERRORS) or type(e).__name__ == "TOMLDecodeError"


def one_line(e: BaseException) -> str:
    """The message of ``e`` on one line; an OSError as ``FILE: cause``."""
    if isinstance(e, typer.TyperException):  # usage errors, BadParameter
        text = e.format_message()
    elif isinstance(e, OSError) and e.filename is not None and e.strerror:
        text = f"{e.filename}: {e.strerror}"
    else:
        text = str(e) or type(e).__name__
        if not _input_error(e):
            text = f"{type(e).__name__}: {text} (a bug? rerun with --debug for the traceback)"
    return " ".join(text.split())


def debug_requested(args: list[str]) -> tuple[bool, list[str]]:
    """Whether ``--debug`` is among ``args`` (before a ``--``), and ``args`` without it."""
    end = args.index("--") if "--" in args else len(args)
    head = [a for a in args[:end] if a != "--debug"]
    return len(head) < end or os.environ.get("MEMORYWALKER_DEBUG", "") not in ("", "0"), head + args[end:]


def report(prog: str, e: BaseException) -> int:
    """Print ``prog: error: ...`` for ``e`` on stderr; return the exit code."""
    typer.echo(f"{prog}: error: {one_line(e)}", err=True)
    return INPUT_ERROR if isinstance(e, typer.TyperException) or _input_error(e) else INTERNAL_ERROR


class OneLineErrors(TyperGroup):
    """A Typer group whose subcommands fail with one line (see the module docstring)."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        debug, args = debug_requested(list(args))
        ctx.meta["memorywalker.debug"] = debug
        return super().parse_args(ctx, args)

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as e:
            if ctx.meta.get("memorywalker.debug"):
                raise
            prog = " ".join(x for x in (ctx.info_name, ctx.invoked_subcommand) if x)
            ctx.exit(report(prog, e))


def run_single(app, prog: str) -> None:
    """Run a one-command Typer ``app`` (``python -m memorywalker.recipes.sft``) with the same errors."""
    debug, args = debug_requested(sys.argv[1:])
    if debug:
        app(args, prog_name=prog)
        return
    try:
        app(args, prog_name=prog, standalone_mode=False)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        raise
    except typer.Abort:
        sys.exit(1)
    except Exception as e:
        sys.exit(report(prog, e))
