"""The typer application, its global options, and the one place errors become exit codes.

Every user error is a :class:`~forgekit.errors.ForgekitError`: :func:`command` prints it as one line
(``error: ...``, plus a ``::error::`` annotation on GitHub Actions) and exits with the error's code;
``--debug`` shows the traceback instead; Ctrl-C exits 130.  Anything else is a bug and keeps its
traceback.  :func:`command` also gives every verb the shared ``--verbose``/``--quiet``/``--debug``.
"""

from __future__ import annotations

import functools
import inspect
import typing
from typing import Annotated, Any, Callable

import typer

from .. import __version__, interrupts, log
from ..errors import ForgekitError

app = typer.Typer(
    name="forgekit",
    help="Compile ONNX models into fast, deployable libraries for CPUs, ARM boards, Android and CUDA.",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
_DEBUG = {"on": False}

VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Also show TVM's own output.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Errors only.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors.")]
_COMMON = {"verbose": VerboseOpt, "quiet": QuietOpt, "debug": DebugOpt}


def _apply_common(verbose: bool = False, quiet: bool = False, debug: bool = False) -> None:
    if debug:
        _DEBUG["on"] = True
    if debug:
        log.set_verbosity(log.DEBUG)
    elif verbose:
        log.set_verbosity(log.VERBOSE)
    elif quiet:
        log.set_verbosity(log.QUIET)


def old_spellings(rewrite: Callable[[list[str]], list[str]]) -> type:
    """A command class (``@app.command(cls=...)``) for a verb that still takes its spellings of earlier
    releases: ``rewrite`` turns its arguments into today's before typer parses them (a flag that became an
    option with a value, a flag renamed onto a shared one), so no option needs declaring twice."""
    from typer.core import TyperCommand

    class OldSpellings(TyperCommand):
        def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
            return super().parse_args(ctx, rewrite(list(args)))

    return OldSpellings


def deprecated(spelling: str, instead: str) -> None:
    """The one line an old spelling of an option prints: it keeps working (scripts written for an earlier
    release must not break), and the line says what to write now."""
    log.warn(f"{spelling} is deprecated (it still works): use {instead}")


def _fail(message: str, code: int) -> None:
    log.error(message)
    raise typer.Exit(code)


def with_options(func: Callable[..., Any], extra: dict[str, tuple[Any, Any]],
                 receive: Callable[[dict[str, Any]], dict[str, Any]], provides: tuple[str, ...] = ()) -> Callable[..., Any]:
    """``func`` with the options ``extra`` (name -> (Annotated type, default)) added to its signature: the wrapper
    takes them out of the call and passes ``receive(values)`` (a dict of keyword arguments) to ``func`` instead;
    ``provides`` names the parameters of ``func`` that ``receive`` fills (they are not command-line options).

    The verb modules use postponed annotations (strings); they are resolved in the verb's own module here,
    since typer would look them up in this one (the wrapper's)."""
    hints = typing.get_type_hints(func, include_extras=True)
    signature = inspect.signature(func)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {name: kwargs.pop(name, default) for name, (_, default) in extra.items()}
        return func(*args, **kwargs, **receive(values))

    params = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in signature.parameters.values()
              if p.kind is not inspect.Parameter.VAR_KEYWORD and p.name not in provides]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind)
               for name, (kind, default) in extra.items()]
    wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {**{k: v for k, v in hints.items() if k not in provides},
                               **{name: kind for name, (kind, _) in extra.items()}}
    return wrapper


def command(func: Callable[..., Any]) -> Callable[..., Any]:
    """A verb: the shared ``--verbose``/``--quiet``/``--debug``, and ForgekitError as one line and an exit
    code (the traceback with --debug)."""

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            with interrupts.watch():
                return func(*args, **kwargs)
        except ForgekitError as exc:
            if _DEBUG["on"]:
                raise
            _fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted", 130)

    def receive(values: dict[str, Any]) -> dict[str, Any]:
        _apply_common(**values)
        return {}

    return with_options(guarded, {name: (kind, False) for name, kind in _COMMON.items()}, receive)


def _version(value: bool) -> None:
    if value:
        print(f"forgekit {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: DebugOpt = False,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    _apply_common(verbose, quiet, debug)
