"""The reproduction report's blocks ((kind, content): headings, paragraphs, lists, details, tables, figures)
rendered as Markdown and as one HTML page, verdicts coloured.

Why apart from the page: what the report says (report.page) and how it is drawn change for different
reasons; the Snakemake report embeds the HTML, a reader of the repository the Markdown."""

from __future__ import annotations

import html

import pandas as pd

from softtokens.verdict import judging

MISSING = "missing"   # a cell with no number: shown, never 0


def to_markdown(blocks) -> str:
    out = []
    for kind, content in blocks:
        if kind in ("h1", "h2", "h3"):
            out.append("#" * int(kind[1]) + " " + content)
        elif kind == "p":
            out.append(content)
        elif kind == "list":
            out.append("\n".join(f"- {x}" for x in content))
        elif kind == "details":
            summary, items = content
            out.append(f"<details><summary>{summary}</summary>\n\n" + "\n".join(f"- {x}" for x in items)
                       + "\n\n</details>")
        elif kind == "table":
            out.append(content.to_markdown(index=False) if not content.empty else "(none)")
        elif kind == "columns":   # side by side in HTML; one after the other here
            out.append("\n\n".join(f"### {title}\n\n" + "\n".join(f"- {x}" for x in items) for title, items in content))
        elif kind == "figure":    # PNG bytes: drawn in the HTML page, named here
            out.append(f"*Figure: {content[1]} (drawn in reproduction.html; its numbers in claims.json)*")
    return "\n\n".join(out) + "\n"


CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:13px;margin:0.5em 0 1.5em}th,td{border:1px solid #ccc;padding:3px 7px;
text-align:left;vertical-align:top}th{background:#f0f0f0}td.v-supported{background:#d9f2d9}
td.v-not-yet-measured{background:#eee;color:#666}td.missing{color:#999}
td.v-not-judged{background:#eee;color:#666}td.v-undecided{background:#fff3cd}td.v-contradicted{background:#f8d7d7}details{margin:0.3em 0}summary{cursor:pointer;font-size:14px}
code{background:#f4f4f4;padding:0 3px}li{font-size:13px}h1{margin:0.4em 0;font-size:26px}h2{margin:0.6em 0 0.3em}
div.columns{display:flex;gap:2em}div.columns>div{flex:1}div.columns h3{margin:0.2em 0}div.columns ul{margin:0.2em 0;
padding-left:1.2em}p{margin:0.4em 0}"""


VERDICT_CSS = {judging.CONTRADICTED: "v-contradicted", judging.NOT_MEASURED: "v-not-yet-measured",
               judging.SUPPORTED: "v-supported", judging.NOT_JUDGED: "v-not-judged", judging.UNDECIDED: "v-undecided"}


def _html_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "<p>(none)</p>"
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = []
    for _, r in df.iterrows():
        cells = []
        for v in r.values:
            text = str(v)
            plain = text.lstrip("*")   # a verdict in bold is still that verdict
            verdict = next((css for k, css in VERDICT_CSS.items() if plain.startswith(k)), None)
            cls = f' class="{verdict}"' if verdict else (' class="missing"' if text == MISSING else "")
            cells.append(f"<td{cls}>{_inline(text)}</td>")   # the cell's markup drawn, never shown as ** or `
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _inline(text: str) -> str:
    import re

    t = html.escape(text)
    t = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r'<a href="\2">\1</a>', t)   # [text](link)
    t = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", t)
    t = re.sub(r"(?<![*\w])\*(?!\s)([^*]+?)\*(?![*\w])", r"<i>\1</i>", t)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", t)


def to_html(blocks, title: str) -> str:
    body = []
    for kind, content in blocks:
        if kind in ("h1", "h2", "h3"):
            body.append(f"<{kind}>{_inline(content)}</{kind}>")
        elif kind == "p":
            body.append(f"<p>{_inline(content)}</p>")
        elif kind == "list":
            body.append("<ul>" + "".join(f"<li>{_inline(x)}</li>" for x in content) + "</ul>")
        elif kind == "details":
            summary, items = content
            body.append(f"<details><summary>{_inline(summary)}</summary><ul>"
                        + "".join(f"<li>{_inline(x)}</li>" for x in items) + "</ul></details>")
        elif kind == "table":
            body.append(_html_table(content))
        elif kind == "figure":
            import base64

            png, caption = content
            body.append(f"<figure><img alt='{html.escape(caption)}' style='max-width:100%' "
                        f"src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
                        f"<figcaption>{_inline(caption)}</figcaption></figure>")
        elif kind == "columns":
            body.append("<div class='columns'>" + "".join(
                f"<div><h3>{_inline(title)}</h3><ul>" + "".join(f"<li>{_inline(x)}</li>" for x in items) + "</ul></div>"
                for title, items in content) + "</div>")
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
