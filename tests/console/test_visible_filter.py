"""The console's one filter for text a person decides on (console/templatetags/visible.py):
characters that runtime.text hides are shown as marked code points, the rest is escaped."""

from __future__ import annotations

import pytest
from django.template import Context, Template

from console.templatetags.visible import visible
from console.web.humans import json_for_editing


@pytest.mark.parametrize(
    "ch",
    ["\u202a", "\u202e", "\u2066", "\u2069", "\u200b", "\u200f", "\u2028", "\u2029", "\ufeff",
     "\u061c", "\u00ad", "\x07", "\U000e0041"],
)  # fmt: skip
def test_each_hidden_character_is_marked(ch):
    label = f"U+{ord(ch):04X}"
    out = visible(f"a{ch}b")
    assert ch not in out
    assert f'<span class="hidden-char" title="{label}' in out
    assert f"&lt;{label}&gt;</span>" in out
    assert out.startswith("a<span") and out.endswith("</span>b")
    assert visible(f"a{ch}b", "text") == f"a<{label}>b"


def test_the_rest_is_escaped_and_line_breaks_stay():
    assert visible('<b x="1">&</b>') == "&lt;b x=&quot;1&quot;&gt;&amp;&lt;/b&gt;"
    assert visible('{\n  "a": 1\n}') == "{\n  &quot;a&quot;: 1\n}"
    assert visible("<i>\u202e</i>") == (
        '&lt;i&gt;<span class="hidden-char" title="U+202E RIGHT-TO-LEFT OVERRIDE">'
        "&lt;U+202E&gt;</span>&lt;/i&gt;"
    )
    assert visible(None) == ""
    assert visible("plain ünïcode 字") == "plain ünïcode 字"


def test_in_a_template_the_marks_are_markup_and_the_text_is_not():
    rendered = Template(
        "{% load visible %}<p>{{ v|visible }}</p><title>{{ v|visible:'text' }}</title>"
    ).render(Context({"v": "acct_1\u202e9876<script>"}))
    assert "\u202e" not in rendered and "<script>" not in rendered
    assert '<p>acct_1<span class="hidden-char"' in rendered
    assert "<title>acct_1&lt;U+202E&gt;9876&lt;script&gt;</title>" in rendered


def test_the_edit_form_json_escapes_hidden_characters_and_parses_back():
    import json

    value = {"account": "acct_1\u202e9876", "note": "x\u200by\n", "tag": "\U000e0041"}
    text = json_for_editing(value)
    assert "\u202e" not in text and "\u200b" not in text and "\U000e0041" not in text
    assert "\\u202e" in text and "\\udb40\\udc41" in text
    assert json.loads(text) == value
