"""One small renderer for every billing document (receipts, credit notes, statements): a `Document` in, PDF bytes out.

    from billing.pdf import Document, Party, Table, Column, render
    pdf: bytes = render(
        Document(
            operator="Acme Data Ltd",                 # at the top of every page, large
            title="Receipt R-2026-000123",
            badge="VOID",                             # optional, in red beside the title ("" for none)
            parties=(Party("Issued by", ("Acme Data Ltd", "1 Road", "VAT GB123")), Party("Billed to", (...))),
            facts=(("Date", "2026-03-01"), ("Order", "ord_..."),),
            table=Table(
                (Column("Description", width=3), Column("Credits", amount=True), Column("USD", amount=True)),
                [("Top-up", 1_000_000, 10.0)],
            ),
            totals=(("Total paid (USD)", 10.0),),
            notes=("Prepaid credits; no tax is charged on this document.",),
            footer="Acme Data Ltd · registered in ...",
        ),
        paper="A4",                                   # or "Letter" (PAPERS)
    )

Cells, facts and totals are strings or numbers: an `int` is printed with thousands separators (1,234,567), a `float`
or `Decimal` with two decimals as well (1,234.50); format anything else (4 decimals, a currency) with `amount()`
first. Amount columns are right-aligned. Text never clips: names, addresses and cells wrap inside their column
(a long word is cut), tables continue on the next page with their header, and the footer is on every page with
"page n of m".

Fonts: a document whose every character is in Windows-1252 (Latin-1 with € and typographic quotes and dashes: most
Western names and addresses) uses the PDF's core Helvetica, nothing embedded, the fastest to render (about 15 ms of
CPU for a receipt). A document with any other character embeds the first of `FONTS` that is installed and has a
glyph for every one of them (a subset of it): Liberation Sans (Latin, Greek, Cyrillic; Helvetica's metrics, so the
page looks the same; about 60 ms), else DejaVu Sans (also Hebrew, Arabic letters, Armenian, Georgian, ...; about
110 ms), else the installed one with the most of them. They come from the system (Debian's `fonts-liberation` and
`fonts-dejavu-core`, which the Dockerfile and `./dev test` install), looked for in `FONT_DIRS`. With neither, such
characters become their closest Windows-1252 form ("Ő" becomes "O") or "?": the document still renders, never fails.
Characters no installed font has (CJK, most emoji) print as "?", never silently left out.
"""

import functools
import logging
import os
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from fontTools.ttLib import TTFont  # fpdf2's own dependency: a font's coverage
from fpdf import FPDF
from fpdf.enums import Align, TableBordersLayout, WrapMode, XPos, YPos
from fpdf.fonts import FontFace

log = logging.getLogger("gateway.billing")

PAPERS = {"A4": "A4", "Letter": "Letter"}
# (regular, bold) file names, in the order tried: the smallest font that covers the document is the fastest to embed.
FONTS = (("LiberationSans-Regular.ttf", "LiberationSans-Bold.ttf"), ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf"))
FONT_DIRS = (
    "/usr/share/fonts/truetype/liberation",  # Debian, Ubuntu (fonts-liberation)
    "/usr/share/fonts/truetype/liberation2",  # (fonts-liberation2)
    "/usr/share/fonts/truetype/dejavu",  # (fonts-dejavu-core)
    "/usr/share/fonts/liberation-sans",  # Fedora
    "/usr/share/fonts/dejavu",
    "/usr/share/fonts/TTF",  # Arch
    "/usr/local/share/fonts",
)
MARGIN = 18  # mm
GREY = (95, 95, 95)
RED = (180, 20, 20)
Cell = str | int | float | Decimal
CORE_ENCODING = "windows-1252"  # what the core fonts can show


@dataclass(frozen=True)
class Party:
    """A block of lines under a small label: the issuer, the customer."""

    label: str
    lines: Sequence[str]


@dataclass(frozen=True)
class Column:
    title: str
    amount: bool = False  # right-aligned
    width: float = 1  # relative to the other columns


@dataclass(frozen=True)
class Table:
    columns: Sequence[Column]
    rows: Sequence[Sequence[Cell]]


@dataclass(frozen=True)
class Document:
    operator: str
    title: str
    badge: str = ""
    parties: Sequence[Party] = ()
    facts: Sequence[tuple[str, Cell]] = ()
    table: Table | None = None
    totals: Sequence[tuple[str, Cell]] = ()
    notes: Sequence[str] = ()
    footer: str = ""
    subject: str = ""  # the PDF's metadata; the title when empty


def amount(value: Cell, decimals: int = 2) -> str:
    """A number as printed on a document: thousands separators, `decimals` places for a non-integer."""
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return f"{value:,}"
    return f"{Decimal(str(value)):,.{decimals}f}"


@dataclass(frozen=True)
class _Font:
    regular: str
    bold: str
    covers: frozenset[int]  # the code points it has glyphs for


@functools.cache
def _fonts() -> tuple[_Font, ...]:
    """The installed fonts of FONTS, in order, each with its coverage (read once per process)."""
    found = []
    for regular, bold in FONTS:
        for folder in FONT_DIRS:
            paths = os.path.join(folder, regular), os.path.join(folder, bold)
            if all(os.path.isfile(path) for path in paths):
                # What both faces have: a name is printed bold, its address regular.
                with TTFont(paths[0], lazy=True) as regular, TTFont(paths[1], lazy=True) as bold:
                    found.append(_Font(*paths, frozenset(regular.getBestCmap()) & frozenset(bold.getBestCmap())))
                break
    if not found:
        log.warning(
            "no font of %s in %s: billing PDFs print text outside Windows-1252 in its closest form", FONTS, FONT_DIRS
        )
    return tuple(found)


def _font_for(chars: set[int]) -> _Font | None:
    """The first installed font with every character, else the one with the most (None: none installed)."""
    fonts = _fonts()
    return next((f for f in fonts if chars <= f.covers), None) or max(
        fonts, key=lambda f: len(chars & f.covers), default=None
    )


def _fits(text: str) -> bool:
    try:
        text.encode(CORE_ENCODING)
    except UnicodeEncodeError:
        return False
    return True


def _core(text: str) -> str:
    """What the core font can print: Windows-1252 as is, else the letter without its accents, else '?'."""
    if _fits(text):
        return text
    out = []
    for char in text:
        plain = (
            char
            if _fits(char)
            else unicodedata.normalize("NFKD", char).encode(CORE_ENCODING, "ignore").decode(CORE_ENCODING)
        )
        out.append(plain or "?")
    return "".join(out)


def _covered(covers: frozenset[int], text: str) -> str:
    """What the embedded font can print: a character it has no glyph for (CJK, most emoji without such a font
    installed) becomes '?', so that a reader sees something was there rather than a name that silently vanished."""
    return "".join(c if ord(c) in covers or not c.isprintable() else "?" for c in text)


def _texts(doc: Document):
    yield from (doc.operator, doc.title, doc.badge, doc.footer, doc.subject, *doc.notes)
    for party in doc.parties:
        yield party.label
        yield from party.lines
    for label, value in (*doc.facts, *doc.totals):
        yield label
        yield amount(value)
    if doc.table is not None:
        yield from (c.title for c in doc.table.columns)
        yield from (amount(cell) for row in doc.table.rows for cell in row)


class _Pdf(FPDF):
    def __init__(self, doc: Document, paper: str):
        super().__init__(format=PAPERS[paper], unit="mm")
        self.doc = doc
        texts = list(_texts(doc))
        font = (
            None
            if all(_fits(text) for text in texts)
            else _font_for({ord(c) for text in texts for c in text if c.isprintable()})
        )
        if font is not None:
            self.add_font("body", "", font.regular)
            self.add_font("body", "B", font.bold)
            self.family, self.clean = "body", functools.partial(_covered, font.covers)
        else:
            self.core_fonts_encoding = CORE_ENCODING
            self.family, self.clean = "helvetica", _core
        self.set_margins(MARGIN, MARGIN, MARGIN)
        self.set_font(self.family, size=9)
        self.footer_lines: list[str] = []
        self.alias_nb_pages()

    def text_block(self, width: float, text: str, size: float = 9.5, bold: bool = False, color=(0, 0, 0), **kw):
        self.set_font(self.family, "B" if bold else "", size)
        self.set_text_color(*color)
        kw.setdefault("align", Align.L)
        self.multi_cell(width, size * 0.5, self.clean(text), new_x=XPos.LMARGIN, new_y=YPos.NEXT, **kw)
        self.set_text_color(0, 0, 0)

    def header(self) -> None:
        self.text_block(self.epw, self.doc.operator, size=16, bold=True)
        if self.page_no() > 1:  # continuation pages: the operator and the title, small
            self.text_block(self.epw, self.doc.title, size=9, color=GREY)
            self.ln(3)

    def footer(self) -> None:
        lines = len(self.footer_lines) + 1
        self.set_y(-(MARGIN + 4 * lines) + 4)
        self.set_font(self.family, "", 8)
        self.set_text_color(*GREY)
        if self.footer_lines:
            self.multi_cell(
                self.epw,
                4,
                self.clean(self.doc.footer),
                align=Align.C,
                new_x=XPos.LMARGIN,
                new_y=YPos.NEXT,
                wrapmode=WrapMode.WORD,
            )
        self.cell(self.epw, 4, f"page {self.page_no()} of {{nb}}", align=Align.C)
        self.set_text_color(0, 0, 0)


def render(doc: Document, paper: str = "A4") -> bytes:
    """The document as a PDF on `paper` ("A4" or "Letter")."""
    if paper not in PAPERS:
        raise ValueError(f"paper must be one of {sorted(PAPERS)}")
    pdf = _Pdf(doc, paper)
    clean = pdf.clean
    pdf.set_title(clean(doc.subject or doc.title))
    pdf.set_author(clean(doc.operator))
    pdf.set_creator("social-gateway")
    pdf.add_page()
    if doc.footer:  # the footer's height, so that the body never runs under it (measuring needs a page)
        pdf.set_font(pdf.family, "", 8)
        pdf.footer_lines = pdf.multi_cell(
            pdf.epw, 4, clean(doc.footer), dry_run=True, output="LINES", wrapmode=WrapMode.WORD
        )
    pdf.set_auto_page_break(True, margin=MARGIN + 4 * (len(pdf.footer_lines) + 1))

    pdf.ln(1)
    y = pdf.get_y()
    pdf.text_block(pdf.epw, doc.title, size=13, bold=True)
    if doc.badge:
        pdf.set_xy(MARGIN, y)
        pdf.text_block(pdf.epw, doc.badge, size=13, bold=True, color=RED, align=Align.R)
    pdf.set_draw_color(*GREY)
    pdf.line(MARGIN, pdf.get_y() + 1.5, MARGIN + pdf.epw, pdf.get_y() + 1.5)
    pdf.ln(5)

    if doc.parties:
        gap = 8
        width = (pdf.epw - gap * (len(doc.parties) - 1)) / len(doc.parties)
        top, bottom = pdf.get_y(), pdf.get_y()
        for i, party in enumerate(doc.parties):
            pdf.set_xy(MARGIN + i * (width + gap), top)
            x = pdf.get_x()
            pdf.set_font(pdf.family, "B", 8)
            pdf.set_text_color(*GREY)
            pdf.multi_cell(width, 4, clean(party.label.upper()), align=Align.L, new_x=XPos.LEFT, new_y=YPos.NEXT)
            pdf.set_text_color(0, 0, 0)
            for n, line in enumerate(party.lines):
                pdf.set_x(x)
                pdf.set_font(pdf.family, "B" if n == 0 else "", 9.5)
                pdf.multi_cell(
                    width, 4.8, clean(line), align=Align.L, new_x=XPos.LEFT, new_y=YPos.NEXT, wrapmode=WrapMode.WORD
                )
            bottom = max(bottom, pdf.get_y())
        pdf.set_xy(MARGIN, bottom + 5)

    plain = FontFace(emphasis="", color=(0, 0, 0))
    if doc.facts:
        pdf.set_font(pdf.family, "", 9.5)
        with pdf.table(
            col_widths=(1, 3),
            v_align="TOP",
            first_row_as_headings=False,
            borders_layout=TableBordersLayout.NONE,
            line_height=5,
            padding=(0.6, 1, 0.6, 0),
            wrapmode=WrapMode.WORD,
        ) as table:
            for label, value in doc.facts:
                row = table.row()
                row.cell(clean(label), style=FontFace(emphasis="B", color=GREY))
                row.cell(clean(amount(value)), style=plain)
        pdf.ln(5)

    if doc.table is not None:
        columns = doc.table.columns
        pdf.set_font(pdf.family, "", 9)
        with pdf.table(
            col_widths=tuple(c.width for c in columns),
            text_align=tuple("RIGHT" if c.amount else "LEFT" for c in columns),
            borders_layout=TableBordersLayout.HORIZONTAL_LINES,
            headings_style=FontFace(emphasis="B", fill_color=(235, 235, 235)),
            line_height=5,
            padding=1.2,
            wrapmode=WrapMode.WORD,
            repeat_headings=1,
        ) as table:
            table.row([clean(c.title) for c in columns])
            for cells in doc.table.rows:
                table.row([clean(amount(cell)) for cell in cells])
        pdf.ln(3)

    if doc.totals:
        pdf.set_font(pdf.family, "B", 10)
        with pdf.table(
            width=pdf.epw * 0.6,
            align=Align.R,
            col_widths=(3, 2),
            text_align=("RIGHT", "RIGHT"),
            first_row_as_headings=False,
            borders_layout=TableBordersLayout.NONE,
            line_height=5.5,
            padding=(0.6, 1.2, 0.6, 1.2),
            wrapmode=WrapMode.WORD,
        ) as table:
            for label, value in doc.totals:
                row = table.row()
                row.cell(clean(label))
                row.cell(clean(amount(value)))
        pdf.ln(4)

    for note in doc.notes:
        pdf.text_block(pdf.epw, note, size=8.5, color=GREY, wrapmode=WrapMode.WORD)
        pdf.ln(1.5)
    return bytes(pdf.output())
