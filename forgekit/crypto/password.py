"""Where passwords come from: a file, an environment variable or a terminal prompt, never argv.

Command-line arguments are visible to every user on the machine (``ps``, ``/proc/PID/cmdline``) and end up
in shell history and CI logs, so forgekit has no ``--password VALUE`` option.
"""

from __future__ import annotations

import getpass
import os
import sys
from pathlib import Path

from ..errors import UsageError
from .errors import EmptyPasswordError, KeyRequiredError, WeakPasswordError

DEFAULT_PASSWORD_ENV = "FORGEKIT_ENCRYPT_PASSWORD"
#: shortest password accepted for *new* encryptions (NIST SP 800-63B's minimum for chosen secrets);
#: existing artifacts open with whatever password they were made with
MIN_PASSWORD_LENGTH = 8


def check_new_password(password: str) -> None:
    """Refuse a password for a new encryption that is empty or shorter than :data:`MIN_PASSWORD_LENGTH`."""
    if not password:
        raise EmptyPasswordError("The encryption password is empty: choose a password of at least "
                                 f"{MIN_PASSWORD_LENGTH} characters.")
    if len(password) < MIN_PASSWORD_LENGTH:
        raise WeakPasswordError(f"The encryption password has {len(password)} characters: choose one of at least "
                                f"{MIN_PASSWORD_LENGTH} (a passphrase of a few words is best).")


def _strip_newline(text: str) -> str:
    if text.endswith("\r\n"):
        return text[:-2]
    if text.endswith("\n"):
        return text[:-1]
    return text


def password_from_env_or_file(password_file: str | os.PathLike[str] | None = None,
                              env: str | None = DEFAULT_PASSWORD_ENV, prompt: bool = True,
                              confirm: bool = False) -> str:
    """Get the password from, in order: ``password_file``, the environment variable ``env``, a prompt.

    Parameters
    ----------
    password_file:
        A file whose content is the password (one trailing newline is removed, nothing else), or ``"-"``
        to read one line from standard input.
    env:
        Name of the environment variable to read (``FORGEKIT_ENCRYPT_PASSWORD``); ``None`` to skip it.
    prompt:
        Ask on the terminal (without echo) when neither of the above gives a password and stdin is a TTY.
    confirm:
        When prompting, ask twice and require the same answer (use it when encrypting).

    Raises
    ------
    EmptyPasswordError
        The file, variable or answer is empty.
    KeyRequiredError
        No source gave a password (or the password file does not exist).
    UsageError
        The two prompted answers differ.
    """
    if password_file is not None:
        if str(password_file) == "-":
            text = sys.stdin.readline()
            source = "standard input"
        else:
            path = Path(password_file)
            try:
                text = path.read_text(encoding="utf-8")
            except FileNotFoundError:
                raise KeyRequiredError(f"Password file '{path}' does not exist: check the --password-file path.") \
                    from None
            except (OSError, UnicodeDecodeError) as exc:
                raise KeyRequiredError(f"Cannot read password file '{path}' ({exc.__class__.__name__}): check its "
                                       f"permissions and that it is UTF-8 text.") from None
            source = f"password file '{path}'"
        password = _strip_newline(text)
        if not password:
            raise EmptyPasswordError(f"The password from {source} is empty: put the password in it.")
        return password
    if env and env in os.environ:
        password = os.environ[env]
        if not password:
            raise EmptyPasswordError(f"The environment variable {env} is set but empty: set it to the password or "
                                     f"unset it.")
        return password
    if prompt and sys.stdin is not None and sys.stdin.isatty():
        password = getpass.getpass("Model password: ")
        if not password:
            raise EmptyPasswordError("The password is empty: type a non-empty password.")
        if confirm and getpass.getpass("Repeat the password: ") != password:
            raise UsageError("The two passwords differ: run the command again.")
        return password
    raise KeyRequiredError(f"No password given: set {env or DEFAULT_PASSWORD_ENV} or pass --password-file "
                           f"(passwords are never taken from the command line).")


def artifact_key(library: str | os.PathLike[str], key_path: str | os.PathLike[str] | None,
                 password: str | None) -> tuple[str, str]:
    """The key file and password that open an encrypted artifact's library.

    Defaults: ``modelKey.bin`` next to the library, the password from ``FORGEKIT_ENCRYPT_PASSWORD``.
    Raises :class:`KeyRequiredError` (one line, saying what to pass) when either is missing.
    """
    default_key = Path(library).parent / "modelKey.bin"
    if key_path is None and default_key.exists():
        key_path = default_key
    if password is None:
        password = os.environ.get(DEFAULT_PASSWORD_ENV)
    if key_path is None or password is None:
        raise KeyRequiredError("Model looks encrypted but no key provided: pass the key file (--key modelKey.bin) "
                               f"and the password ({DEFAULT_PASSWORD_ENV} or --password-file).")
    return str(key_path), password
