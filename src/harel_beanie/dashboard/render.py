"""The pages' Jinja2 templates and the filters they format values with.

Why this module exists: every page shows times, ages, JSON and execution ids the same way;
the filters are declared once, on the one template environment each dashboard renders with.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

from fastapi.templating import Jinja2Templates

from harel_beanie.dashboard.links import id_placeholder, typed_id
from harel_beanie.queries.backlog import human_duration

TEMPLATES = Path(__file__).parent / "templates"


def when(ts: Optional[float]) -> str:
    """An epoch time as local date and time ("" for none)."""
    return "" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def ago(seconds: Optional[float]) -> str:
    """An age for people ("" for none)."""
    return "" if seconds is None else human_duration(seconds)


def templates() -> Jinja2Templates:
    """The templates, with the filters the pages use."""
    t = Jinja2Templates(directory=str(TEMPLATES))
    t.env.filters["when"] = when
    t.env.filters["ago"] = ago
    t.env.filters["pretty"] = lambda v: json.dumps(v, indent=2, sort_keys=True, default=str)
    t.env.filters["typed"] = typed_id
    t.env.filters["id_placeholder"] = id_placeholder
    return t
