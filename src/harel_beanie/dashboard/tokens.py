"""The standalone dashboard's token, kept in the data folder so that a restart keeps its link.

Why this module exists: `harel-beanie dashboard` guards its pages with a token it prints as a
link. Drawn anew at every start, the link a person bookmarked (or a browser's cookie) stopped
working each time the dashboard was restarted. On the embedded server the token is kept in
the data folder, beside the server's own files (`<data folder>/dashboard-token`), readable by
its owner only (mode 0600): a restart in that folder reads it back, and `--new-token` draws a
new one (every link and cookie given before stops working). A token given by `--token` or
`HAREL_DASHBOARD_TOKEN` is used as it is and never written; with a server named by URL there
is no data folder, and a token is drawn at each start unless one is given.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Optional

#: the file, in the data folder
TOKEN_FILE = "dashboard-token"
#: the characters of a token drawn here (`secrets.token_urlsafe`): a file holding anything
#: else was not written by this module, and is replaced
_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def new_token() -> str:
    return secrets.token_urlsafe(18)


def read_token(path: Path) -> Optional[str]:
    """The token kept at `path`, or None when there is none (or not one of ours)."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    return text if len(text) >= 16 and set(text) <= _ALPHABET else None


def write_token(path: Path, token: str) -> None:
    """`token` at `path`, mode 0600 from the moment the file exists (written beside it, then
    moved over the old one, so a reader never sees half a token)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    spare = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(spare, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an older spare file of that name keeps its mode through O_CREAT
        os.write(fd, (token + "\n").encode("ascii"))
    finally:
        os.close(fd)
    os.replace(spare, path)


def kept_token(folder: Optional[Path], *, rotate: bool = False) -> str:
    """The dashboard's token: the one kept in `folder` (the data folder), else a new one kept
    there; with `rotate`, a new one in any case. Without a folder, a new one, not kept."""
    if folder is None:
        return new_token()
    path = Path(folder) / TOKEN_FILE
    token = None if rotate else read_token(path)
    if token is None:
        token = new_token()
        write_token(path, token)
    elif path.stat().st_mode & 0o077:
        path.chmod(0o600)  # copied or unpacked with a wider mode: the owner's only, again
    return token
