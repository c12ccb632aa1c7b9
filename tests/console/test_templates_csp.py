"""The pages' Content-Security-Policy allows styles only from the console's own stylesheet
(``style-src 'self'``): an inline ``style`` attribute would be blocked by the browser (and
reported as a violation), so no template may carry one."""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings

TEMPLATES = Path(settings.BASE_DIR) / "templates"


def test_no_template_carries_an_inline_style_attribute():
    offenders = [
        f"{path.relative_to(TEMPLATES)}:{n}"
        for path in sorted(TEMPLATES.rglob("*.html"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\sstyle\s*=", line)
    ]
    assert not offenders, offenders
