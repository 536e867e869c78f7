"""What the HTML reports share (`diagnose --html`, `rewrite --html`, `verify --html`): one self-contained page,
no network, no scripts, no external assets; every text from a file or a program is escaped."""

from __future__ import annotations

import html
import re

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #222; }
h1 { font-size: 1.3rem; } h2 { font-size: 1.1rem; margin-top: 2rem; }
code { font-family: ui-monospace, monospace; background: #f2f2f2; padding: 0 0.2em; }
table { border-collapse: collapse; width: 100%; }
th, td { border: 1px solid #ccc; padding: .4rem; vertical-align: top; text-align: left; overflow-wrap: anywhere; }
th { background: #f3f3f3; } td.count { text-align: right; } .explanation { color: #555; font-size: .9rem; }
.none { color: #2ca02c; }
"""

_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def inline(text: str) -> str:
    """Escaped text with Markdown code spans (`xm.mark_step()`) as <code>, as the messages are
    written for Markdown readers (SARIF, GitHub)."""
    return _CODE_SPAN.sub(r"<code>\1</code>", html.escape(text))


def page(title: str, style: str, body: str) -> str:
    """The whole document: `title` is escaped here, `style` (added to STYLE) and `body` are HTML."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{STYLE}{style}</style></head>
<body>
<h1>{html.escape(title)}</h1>
{body}
</body></html>
"""
