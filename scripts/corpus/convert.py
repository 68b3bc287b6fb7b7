"""Converters of scripts/corpus/corpus.py: man pages (roff), Perl's POD and HTML to plain text,
deterministic and in the standard library alone (the text depends on the packages and this file,
not on the groff or perl a machine has). docs/corpus.md describes what each keeps and drops.
"""
from __future__ import annotations

import html
import html.parser
import re


# --------------------------------------------------------------------------------------------
# Converters: roff (man pages), POD and HTML to plain text. Deliberately simple and
# deterministic (they depend on this file alone, not on the groff or perl installed).
# --------------------------------------------------------------------------------------------

# roff special characters (\(xx, \[xx]) and strings (\*(xx) to Unicode; unknown ones are dropped.
ROFF_CHARS = {
    "em": "\u2014", "en": "\u2013", "hy": "-", "aq": "'", "dq": '"', "lq": "\u201c", "rq": "\u201d",
    "oq": "\u2018", "cq": "\u2019", "bu": "\u2022", "co": "\u00a9", "rg": "\u00ae", "tm": "\u2122",
    "de": "\u00b0", "+-": "\u00b1", "mu": "\u00d7", "di": "\u00f7", "<=": "\u2264", ">=": "\u2265",
    "!=": "\u2260", "->": "\u2192", "<-": "\u2190", "ha": "^", "ti": "~", "rs": "\\", "sl": "/",
    "ga": "`", "ul": "_", "bv": "|", "or": "|", "sq": "\u25a1", "Fo": "\u00ab", "Fc": "\u00bb",
    "fo": "\u2039", "fc": "\u203a", "ss": "\u00df", "pl": "+", "mi": "-", "eq": "=", "lh": "\u261c",
    "rh": "\u261e", "ct": "\u00a2", "Po": "\u00a3", "Eu": "\u20ac", "Ye": "\u00a5", "ps": "\u00b6",
    "sc": "\u00a7", "dg": "\u2020", "dd": "\u2021", "aa": "\u00b4", "a\"": "\u02dd", "12": "\u00bd",
    "14": "\u00bc", "34": "\u00be", "no": "\u00ac", "if": "\u221e", "*a": "\u03b1", "*b": "\u03b2",
    "*m": "\u00b5", "*p": "\u03c0", "ou": "\u2018", "R": "\u00ae", "Tm": "\u2122", "lB": "[", "rB": "]",
    "lC": "{", "rC": "}", "la": "\u27e8", "ra": "\u27e9", "at": "@", "sh": "#", "Do": "$", "ci": "\u25cb",
    ":a": "\u00e4", ":o": "\u00f6", ":u": "\u00fc", ":A": "\u00c4", ":O": "\u00d6", ":U": "\u00dc",
    "'e": "\u00e9", "'a": "\u00e1", "`a": "\u00e0", "`e": "\u00e8", ",c": "\u00e7", "~n": "\u00f1",
    "fi": "fi", "fl": "fl", "ff": "ff", "BS": "\\",
}
# roff strings (\*x, \*(xx, \*[name]): man(7)'s quotes and marks, pod2man's; others are dropped.
ROFF_STRINGS = {"lq": "\u201c", "rq": "\u201d", "R": "\u00ae", "Tm": "\u2122", "--": "\u2014", "Aq": "'",
                "L\"": "\u201c", "R\"": "\u201d"}

_ROFF_ESCAPE = re.compile(
    r"\\(?:"
    r"(?P<font>f(?:\[[^\]]*\]|\(..|.))"  # font change
    r"|(?P<size>s(?:[+-]?\d|\([+-]?\d\d|\[[^\]]*\]|'[^']*'))"  # point size
    r"|\((?P<char2>..)"  # \(xx
    r"|\[(?P<charb>[^\]]*)\]"  # \[name]
    r"|\*(?:\((?P<str2>..)|\[(?P<strb>[^\]]*)\]|(?P<str1>.))"  # \*x, \*(xx, \*[name]
    r"|[nmMgkVY$](?:\((?:..)|\[[^\]]*\]|.)"  # registers, colours, ... (dropped)
    r"|[hvwoDlLXbCNRSxZHB](?P<q>['\[|])(?P<arg>.*?)(?:(?P=q)|\])"  # quoted-argument escapes
    r"|(?P<one>.)"
    r")",
    re.S,
)
_ROFF_SINGLE = {"-": "-", "e": "\\", "\\": "\\", "&": "", "|": "", "^": "", "~": " ", " ": " ", "0": " ",
                "c": "", "%": "", ":": "", "'": "\u00b4", "`": "`", ".": ".", ",": "", "/": "", "t": "\t",
                "a": "", "d": "", "u": "", "r": "", "p": "", "E": "\\", "z": "", "!": "", "{": "", "}": "",
                "\"": "", "#": "", "?": "", "@": ""}


def _roff_char(name: str) -> str:
    if name in ROFF_CHARS:
        return ROFF_CHARS[name]
    m = re.fullmatch(r"u([0-9A-Fa-f]{4,6})", name)  # \[u00E9]
    if m:
        return chr(int(m.group(1), 16))
    return ""


def _roff_escape(m: re.Match) -> str:
    if m.group("font") or m.group("size"):
        return ""
    for g in ("char2", "charb"):
        if m.group(g) is not None:
            return _roff_char(m.group(g))
    for g in ("str2", "strb", "str1"):
        if m.group(g) is not None:
            return ROFF_STRINGS.get(m.group(g), "")
    if m.group("q") is not None:
        if m.group(0)[1] == "N":  # \N'nnn': a character by number
            return chr(int(m.group("arg"))) if m.group("arg").isdigit() else ""
        return ""
    one = m.group("one")
    return _ROFF_SINGLE.get(one, one) if one is not None else ""


def _roff_inline(text: str) -> str:
    return _ROFF_ESCAPE.sub(_roff_escape, text)


def _roff_args(rest: str) -> list[str]:
    """A request's arguments: blank-separated, double quotes group ("" is a literal quote)."""
    args, cur, quoted, i, any_ = [], [], False, 0, False
    while i < len(rest):
        c = rest[i]
        if quoted:
            if c == '"':
                if i + 1 < len(rest) and rest[i + 1] == '"':
                    cur.append('"')
                    i += 1
                else:
                    quoted = False
            else:
                cur.append(c)
        elif c == '"':
            quoted, any_ = True, True
        elif c in " \t":
            if cur or any_:
                args.append("".join(cur))
                cur, any_ = [], False
        elif c == "\\" and i + 1 < len(rest):
            cur.append(rest[i:i + 2])
            i += 1
        else:
            cur.append(c)
        i += 1
    if cur or any_:
        args.append("".join(cur))
    return args


class Skip(Exception):
    """A converter's verdict that a file is no document; the message is the reason counted."""


def roff_to_text(src: str) -> str:
    """A man page's roff source as plain text; Skip("alias") for a page that only sources
    another (.so).

    The man(7) macros (headings, paragraphs, tagged paragraphs, font alternation, no-fill
    blocks, tbl tables, URLs) are rendered; filled text becomes one line per paragraph; other
    requests, macro definitions and conditionals are dropped."""
    # Join continuation lines (a line ending in an unescaped backslash).
    lines = re.sub(r"(?<!\\)\\\n", "", src).split("\n")
    out: list[str] = []  # finished lines
    para: list[str] = []  # the filled paragraph being built
    nofill = False
    table = None  # None, "options" (before the format section ends), or "data"
    skip_until_dots = False
    url_stack: list[str] = []
    tag_next = False  # after .TP: the next line of text is the paragraph's tag, a line of its own

    def flush() -> None:
        if para:
            out.append(" ".join(p for p in para if p))
            para.clear()

    def brk(blank: bool = True) -> None:
        flush()
        if blank and out and out[-1] != "":
            out.append("")

    def emit(text: str) -> None:
        nonlocal tag_next
        if tag_next and text.strip():
            tag_next = False
            flush()
            out.append(text.strip())
        elif nofill or table == "data":
            flush()
            out.append(text.rstrip())
        elif text.strip():
            para.append(text.strip())

    for raw in lines:
        if skip_until_dots:
            if raw.startswith(".."):
                skip_until_dots = False
            continue
        if raw.startswith(('.\\"', "'\\\"", '.\\#')) or raw.startswith('\\"'):
            continue
        # An inline comment: \" to the end of the line (not \\").
        raw = re.sub(r'(?<!\\)\\".*$', "", raw)
        if table is not None:
            if raw.startswith((".TE",)):
                table = None
                brk()
                continue
            if raw.startswith(".T&"):
                table = "options"
                continue
            if table == "options":
                # tbl's options line ends with ';', its format lines, the last with '.'.
                if raw.rstrip().endswith("."):
                    table = "data"
                continue
            if raw.startswith((".", "'")) and not raw.startswith((".T{",)):
                # requests inside a table (.sp, .br, ...): treat as a row break
                continue
            row = raw.replace("T{", "").replace("T}", "")
            emit(_roff_inline(row).replace("\t", "  "))
            continue
        if raw[:1] in (".", "'") and len(raw) > 1:
            m = re.match(r"[.'][ \t]*(\S*)[ \t]*(.*)", raw)
            name, rest = m.group(1), m.group(2)
            args = [_roff_inline(a) for a in _roff_args(rest)]
            if name == "so":
                raise Skip("alias")
            if name in ("de", "de1", "am", "ig"):
                skip_until_dots = True
            elif name in ("SH", "SS"):
                brk()
                nofill = False  # a no-fill block ends with its section (Tcl's close theirs in .BE)
                head = " ".join(args)
                out.append(head.upper() if name == "SH" else head)
            elif name in ("PP", "LP", "P", "sp", "HP", "bp", "Sp"):  # Sp: pod2man's
                brk()
            elif name in ("br", "ti"):
                flush()
            elif name in ("TP", "TQ"):
                brk(name == "TP")
                tag_next = True
            elif name == "IP":
                brk()
                if args and args[0]:
                    out.append(args[0])
            elif name in ("B", "I", "SM", "SB"):
                if args:
                    emit(" ".join(args))
            elif name in ("BR", "BI", "IB", "IR", "RB", "RI"):
                emit("".join(args))
            elif name in ("nf", "EX", "Vb", "CS"):  # Vb: pod2man's verbatim, CS: Tcl's code
                flush()
                nofill = True
            elif name in ("fi", "EE", "Ve", "CE", "BE"):
                flush()
                nofill = False
            elif name == "TS":
                brk()
                table = "options"
            elif name in ("UR", "MT"):
                url_stack.append(args[0] if args else "")
            elif name in ("UE", "ME"):
                url = url_stack.pop() if url_stack else ""
                emit((f"<{url}>" if url else "") + "".join(args))
            elif name == "QW":  # Tcl's quoted word: .QW word [punctuation]
                emit("\u201c" + (args[0] if args else "") + "\u201d" + "".join(args[1:]))
            elif name == "AP":  # Tcl's argument: .AP type name in/out
                brk()
                out.append(" ".join(args[:2]) + (f" ({args[2]})" if len(args) > 2 else ""))
            elif name == "SY":
                brk()
                emit(" ".join(args))
            elif name == "OP":
                emit("[" + " ".join(args) + "]")
            elif name == "TH":
                if args:
                    out.append(f"{args[0]}({args[1]})" if len(args) > 1 else args[0])
                    out.append("")
            # Other requests (.RS, .RE, .in, .ad, .nh, .hy, .PD, .ft, .if, .ie, .el, .ds, .nr, ...)
            # change layout only, or need a full roff to evaluate: dropped.
            continue
        emit(_roff_inline(raw))
    flush()
    return "\n".join(out).strip() + "\n"


_POD_ENTITIES = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/", "amp": "&", "quot": '"', "apos": "'"}


def _pod_code(letter: str, body: str) -> str:
    if letter in "XZ":
        return ""
    if letter == "E":
        if body in _POD_ENTITIES:
            return _POD_ENTITIES[body]
        if body.isdigit():
            return chr(int(body))
        if body.lower().startswith("0x"):
            return chr(int(body, 16))
        return html.unescape(f"&{body};")
    if letter == "L":
        if "|" in body:
            return body.split("|", 1)[0]
        if "/" in body and not body.startswith(("http:", "https:", "ftp:")):
            page, sec = body.split("/", 1)
            sec = sec.strip('"')
            return f'"{sec}" in {page}' if page else f'"{sec}"'
        return body
    return body  # B I C F S: the text


_POD_MULTI_OPEN = re.compile(r"([A-Z])(<{2,})\s")  # C<< ... >>, C<<< ... >>>: closed by as many '>'
_POD_SINGLE = re.compile(r"([A-Z])<([^<>]*)>")


def _pod_inline(text: str) -> str:
    # The multi-bracket forms first (their content may hold single '<' and '>').
    pos = 0
    while m := _POD_MULTI_OPEN.search(text, pos):
        close = re.compile(r"\s" + ">" * len(m.group(2)))
        c = close.search(text, m.end())
        if c is None:
            pos = m.end()
            continue
        rep = _pod_code(m.group(1), text[m.end():c.start()].strip())
        text = text[:m.start()] + rep + text[c.end():]
        pos = m.start() + len(rep)
    for _ in range(10):  # innermost first, until no code is left
        new = _POD_SINGLE.sub(lambda m: _pod_code(m.group(1), m.group(2)), text)
        if new == text:
            break
        text = new
    return text.strip()


def pod_to_text(src: str) -> str:
    """Perl's POD as plain text: headings and items as lines, ordinary paragraphs filled to
    one line, verbatim (indented) paragraphs kept, formatting codes resolved; =begin/=for
    blocks for other formatters dropped."""
    out: list[str] = []
    in_pod = True
    skip_block = False
    for para in re.split(r"\n[ \t]*\n", src.replace("\r\n", "\n")):
        if not para.strip():
            continue
        m = re.match(r"=([A-Za-z]\w*)\s*(.*)", para, re.S)
        if m:  # a command paragraph; any but =cut starts (or continues) POD
            cmd, rest = m.group(1), " ".join(m.group(2).split())
            in_pod = cmd != "cut"
            if cmd == "begin":
                skip_block = not rest.lower().startswith("text")
            elif cmd == "end":
                skip_block = False
            elif skip_block or cmd in ("pod", "cut", "for", "encoding", "over", "back"):
                pass
            elif cmd.startswith("head"):
                out.append(_pod_inline(rest))
            elif cmd == "item":
                item = _pod_inline(rest)
                out.append(item if item not in ("*", "") else "-")
            continue
        if not in_pod or skip_block:
            continue
        if para[0] in " \t":
            out.append(para.rstrip())  # verbatim
        else:
            out.append(_pod_inline(" ".join(para.split())))
    return "\n\n".join(out).strip() + "\n"


class _HtmlText(html.parser.HTMLParser):
    """HTML to plain text: block elements become line breaks, <pre> is kept as it is, other
    whitespace collapses; scripts, styles, the <head> and navigation (sidebars, headers,
    footers, tables of contents, anchors' pilcrows) are dropped. A skipped element left
    unclosed (<li>, <p>, <td> may omit their end tags) ends where its parent does."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
            "track", "wbr"}
    SKIP_TAGS = {"script", "style", "head", "nav", "footer", "noscript", "template", "svg", "button", "form",
                 "select"}
    # class or id tokens (or "tag.token") of navigation in the generators used by these packages
    # (Sphinx and its Read the Docs theme, DocBook, Publican, mdBook, texi2any, Django's, Apache's
    # and SQLite's pages); elements with an ARIA navigation role are dropped too
    SKIP_MARKERS = {"sphinxsidebar", "related", "footer", "headerlink", "navheader", "navfooter", "sidebar",
                    "menu-bar", "menu-bar-hover-placeholder", "nav-chapters", "nav-wrapper", "nav-wide-wrapper",
                    "toc", "breadcrumbs", "breadcrumb", "searchbox", "page-header", "toplang", "bottomlang",
                    "quickview", "sidebar-scrollbox", "hd", "ft", "billboard", "doc-versions", "browse-horizontal",
                    "search", "skip-link", "top", "up", "path", "mobile-nav-chapters", "docs-sidebar", "ftr",
                    "back-to-top", "theme-popup", "sidebar-toggle", "menu-title",
                    "nosearch", "menu", "searchmenu", "tagline", "fancy_toc", "imgcontainer",  # SQLite's
                    "docnav", "banner", "rst-footer-buttons", "nav-panel", "table.header", "wy-breadcrumbs"}
    BLOCK = {"p", "div", "section", "article", "main", "table", "tr", "ul", "ol", "dl", "dt", "dd", "blockquote",
             "h1", "h2", "h3", "h4", "h5", "h6", "hr", "figure", "figcaption", "aside", "caption", "pre",
             "tbody", "thead", "body", "html", "header", "center", "details", "summary"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.open: list[str] = []  # the elements open outside skipped ones
        self.skip_tag: str | None = None  # the element being skipped
        self.skip_open: list[str] = []  # the elements open inside it
        self.pre = 0

    def _skip(self, tag: str, attrs) -> bool:
        if tag in self.SKIP_TAGS:
            return True
        for k, v in attrs:
            if k in ("class", "id") and v and any(t in self.SKIP_MARKERS or f"{tag}.{t}" in self.SKIP_MARKERS
                                                  for t in v.split()):
                return True
            if k == "role" and v in ("navigation", "search", "banner", "contentinfo"):
                return True
        return False

    def _break(self, n: int) -> None:
        self.parts.append("\n" * n)

    def _at_line_start(self) -> bool:
        for p in reversed(self.parts):
            if p:
                return p.endswith("\n")
        return True

    def _inline(self, text: str) -> None:
        """Filled text: no blank at the start of a line (collapsed whitespace leaves one)."""
        if self._at_line_start():
            text = text.lstrip(" ")
        if text:
            self.parts.append(text)

    def handle_starttag(self, tag, attrs):
        if self.skip_tag is not None:
            if tag not in self.VOID:
                self.skip_open.append(tag)
            return
        if self._skip(tag, attrs):
            if tag not in self.VOID:
                self.skip_tag, self.skip_open = tag, []
            return
        if tag not in self.VOID:
            self.open.append(tag)
        if tag == "pre":
            self.pre += 1
        if tag == "br":
            self._break(1)
        elif tag == "li":
            self._break(1)
            self.parts.append("- ")
        elif tag in ("td", "th"):
            self._inline(" ")
        elif tag in ("h1", "h2", "h3", "h4", "h5", "h6", "p", "pre", "blockquote", "dl", "ul", "ol", "table"):
            self._break(2)
        elif tag in self.BLOCK:
            self._break(1)

    def handle_startendtag(self, tag, attrs):
        if self.skip_tag is None and tag == "br":
            self._break(1)

    def handle_endtag(self, tag):
        if self.skip_tag is not None:
            if tag in self.skip_open:  # an element inside the skipped one closes
                while self.skip_open.pop() != tag:
                    pass
                return
            if tag == self.skip_tag:
                self.skip_tag = None
                return
            if tag not in self.open:
                return
            # An enclosing element closes: the skipped one had no end tag (<li>, <p>, <td> may
            # omit theirs), so it ends here too.
            self.skip_tag = None
        if tag in self.open:
            while self.open.pop() != tag:
                pass
        if tag == "pre" and self.pre:
            self.pre -= 1
        if tag in ("h1", "h2", "h3", "h4", "h5", "h6", "p", "pre", "blockquote", "dl", "ul", "ol", "table"):
            self._break(2)
        elif tag in self.BLOCK or tag == "li":
            self._break(1)

    def handle_data(self, data):
        if self.skip_tag is not None:
            return
        if self.pre:
            self.parts.append(data)
        else:
            self._inline(re.sub(r"\s+", " ", data))

    def text(self) -> str:
        s = "".join(self.parts).replace("\u00b6", "")
        s = re.sub(r"[ \t]+\n", "\n", s)  # trailing blanks
        s = re.sub(r"(?m)^-\n+(?=\S)", "- ", s)  # a list item's text on its marker's line
        s = re.sub(r"\n{3,}", "\n\n", s)
        return s.strip() + "\n"


def html_to_text(src: str) -> str:
    """HTML as plain text (_HtmlText); Skip("not_english") for a page whose <html lang> is not
    English (apache2-doc's en/ directory holds some translations)."""
    m = re.search(r"<html[^>]*\slang=[\"']?([A-Za-z-]+)", src[:4096], re.I)
    if m and not m.group(1).lower().startswith("en"):
        raise Skip("not_english")
    p = _HtmlText()
    p.feed(src)
    p.close()
    return p.text()
