"""``forgekit encrypt``, ``decrypt`` and ``rekey``: adapters over :mod:`forgekit.artifact.encryption`."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from .app import app, command
from .options import ForceOpt, KeyOpt, PasswordFileOpt, password


@app.command()
@command
def encrypt(
    artifact: Annotated[str, typer.Argument(metavar="ARTIFACT", help="Artifact directory to encrypt in place.")],
    password_file: PasswordFileOpt = None,
) -> None:
    """Encrypt an existing artifact's library in place and write modelKey.bin next to it."""
    from ..artifact.encryption import encrypt_artifact
    from ..artifact.layout import artifact_dir

    artifact_dir(artifact)
    key = encrypt_artifact(artifact, password(password_file, confirm=True))
    print(f"encrypted {artifact}; key file {key}")


@app.command()
@command
def decrypt(
    artifact: Annotated[str, typer.Argument(metavar="ARTIFACT", help="Encrypted artifact directory.")],
    output: Annotated[str, typer.Option("--output", "-o", metavar="DIR", help="Directory for the decrypted copy.")],
    key: KeyOpt = None,
    password_file: PasswordFileOpt = None,
    force: ForceOpt = False,
) -> None:
    """Write a decrypted copy of an encrypted artifact (the original is left untouched)."""
    from ..artifact.encryption import decrypt_artifact
    from ..artifact.layout import artifact_dir
    from ..artifact.outputs import check_output

    artifact_dir(artifact)
    check_output(output, force=force, kind="artifact", inputs=[artifact, key])
    path = decrypt_artifact(artifact, output, password(password_file), key_path=key, force=force)
    print(f"decrypted artifact: {path}")


@app.command()
@command
def rekey(
    key: Annotated[str, typer.Argument(metavar="KEYFILE", help="Key file (modelKey.bin) to re-protect.")],
    password_file: PasswordFileOpt = None,
    new_password_file: Annotated[Optional[str], typer.Option(
        "--new-password-file", metavar="FILE",
        help="The new password (default: FORGEKIT_NEW_ENCRYPT_PASSWORD or a prompt).")] = None,
) -> None:
    """Change the password of a key file without re-encrypting the library."""
    from .. import crypto

    old = password(password_file)
    new = crypto.password_from_env_or_file(new_password_file, env="FORGEKIT_NEW_ENCRYPT_PASSWORD",
                                           prompt=sys.stdin.isatty(), confirm=True)
    crypto.rekey(key, old, new)
    print(f"re-keyed {key}")
