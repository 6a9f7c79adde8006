"""The dashboard's script and styles, and the vendored Mermaid that draws the statecharts:
files of the package, served from `/static` (the pages' policy allows nothing inline).
"""

from __future__ import annotations

from pathlib import Path

from fastapi.responses import FileResponse, Response

from harel_beanie.dashboard.security import NotFound, static_headers

STATIC = Path(__file__).parent.parent / "static"
#: the files under /static, with their media types: nothing else is served from there
STATIC_FILES = {
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
    # Mermaid, vendored (see static/VENDORED.md): the statechart is drawn with no CDN
    "mermaid.min.js": "text/javascript",
    "mermaid.LICENSE": "text/plain",
}


async def static(filename: str) -> Response:
    media = STATIC_FILES.get(filename)
    if media is None:
        raise NotFound(f"no static file {filename!r}")
    return FileResponse(STATIC / filename, media_type=media, headers=static_headers())
