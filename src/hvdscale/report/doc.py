"""The report's typesetting toolkit (reportlab): paragraph styles, a story builder with
numbered sections, tables and figures, and a canvas with a header and 'page N of M'."""

from __future__ import annotations

from pathlib import Path
from xml.sax.saxutils import escape

from hvdscale.figures.style import STYLE, WIDTH


def styles():
    """The paragraph styles by name: (parent in reportlab's sample sheet, settings)."""
    from reportlab.lib import colors
    from reportlab.lib.enums import TA_CENTER, TA_RIGHT
    from reportlab.lib.styles import ParagraphStyle, getSampleStyleSheet

    bold = "Helvetica-Bold"
    grey = colors.HexColor
    spec = {
        "title": ("Title", dict(fontSize=18, leading=22, spaceAfter=4)),
        "subtitle": (
            "Normal",
            dict(
                fontSize=9.5,
                leading=12,
                alignment=TA_CENTER,
                textColor=grey("#444444"),
                spaceAfter=10,
            ),
        ),
        "h1": (
            "Heading1",
            dict(fontSize=13, leading=16, spaceBefore=10, spaceAfter=5, keepWithNext=1),
        ),
        "h2": (
            "Heading2",
            dict(fontSize=10.5, leading=13, spaceBefore=7, spaceAfter=3, keepWithNext=1),
        ),
        "body": ("BodyText", dict(fontSize=9, leading=11.6, spaceAfter=4)),
        "bullet": (
            "BodyText",
            dict(fontSize=9, leading=11.6, leftIndent=10, bulletIndent=2, spaceAfter=1.5),
        ),
        "cell": ("BodyText", dict(fontSize=7, leading=8.4, spaceAfter=0, spaceBefore=0)),
        "cellhead": ("BodyText", dict(fontName=bold, fontSize=7, leading=8.4)),
        "cellhead_r": (
            "BodyText",
            dict(fontName=bold, fontSize=7, leading=8.4, alignment=TA_RIGHT),
        ),
        "caption": (
            "BodyText",
            dict(fontSize=8, leading=10, spaceBefore=2, spaceAfter=10, textColor=grey("#222222")),
        ),
        "note": ("BodyText", dict(fontSize=8, leading=10, textColor=grey("#555555"))),
    }
    ss = getSampleStyleSheet()
    return {
        name: ParagraphStyle(name, parent=ss[parent], **kw) for name, (parent, kw) in spec.items()
    }


class Doc:
    """Story builder with section, table and figure numbering."""

    def __init__(self):
        self.st = styles()
        self.story: list = []
        self.n_section = 0
        self.n_table = 0
        self.n_figure = 0

    def section(self, title: str):
        """A numbered top-level heading ('3  Results')."""
        self.n_section += 1
        self.h1(f"{self.n_section}  {title}")

    def page_break(self):
        from reportlab.platypus import PageBreak

        self.story.append(PageBreak())

    def p(self, text, style="body"):
        from reportlab.platypus import Paragraph

        self.story.append(Paragraph(text, self.st[style]))

    def bullets(self, items):
        from reportlab.platypus import Paragraph

        for it in items:
            self.story.append(Paragraph(it, self.st["bullet"], bulletText="\u2022"))

    def h1(self, text):
        self.p(escape(text), "h1")

    def h2(self, text):
        self.p(escape(text), "h2")

    def cell(self, text, head=False, right=False):
        from reportlab.platypus import Paragraph

        style = ("cellhead_r" if right else "cellhead") if head else "cell"
        return Paragraph(escape(str(text)), self.st[style])

    def table(
        self,
        caption: str,
        header: list[str],
        rows: list[list],
        widths_mm: list[float],
        *,
        spans: list[int] = (),
        align_right_from: int = 1,
        zebra: bool = True,
        keep: bool = False,
    ):
        """A numbered table: caption above, header repeated on every page.

        ``spans``: row indices (0-based, data rows) that are group headers spanning all columns.
        """
        from reportlab.lib import colors
        from reportlab.lib.units import mm
        from reportlab.platypus import KeepTogether, Paragraph, Table, TableStyle

        self.n_table += 1
        cap = Paragraph(f"<b>Table {self.n_table}.</b> {caption}", self.st["caption"])
        body = [r for k, r in enumerate(rows) if k not in set(spans)]
        # a column of text cells (Paragraphs, laid out left) keeps its header left too
        text = {
            i
            for i in range(len(header))
            if body and all(i < len(r) and isinstance(r[i], Paragraph) for r in body)
        }
        data = [
            [
                self.cell(h, head=True, right=i >= align_right_from and i not in text)
                for i, h in enumerate(header)
            ]
        ] + rows
        t = Table(data, colWidths=[w * mm for w in widths_mm], repeatRows=1, hAlign="LEFT")
        cmds = [
            ("FONT", (0, 0), (-1, -1), "Helvetica", 7),
            ("LEADING", (0, 0), (-1, -1), 8.4),
            ("VALIGN", (0, 0), (-1, -1), "TOP"),
            ("ALIGN", (align_right_from, 1), (-1, -1), "RIGHT"),
            ("LINEABOVE", (0, 0), (-1, 0), 0.8, colors.black),
            ("LINEBELOW", (0, 0), (-1, 0), 0.5, colors.black),
            ("LINEBELOW", (0, -1), (-1, -1), 0.8, colors.black),
            ("TOPPADDING", (0, 0), (-1, -1), 1.6),
            ("BOTTOMPADDING", (0, 0), (-1, -1), 1.6),
            ("LEFTPADDING", (0, 0), (-1, -1), 2.5),
            ("RIGHTPADDING", (0, 0), (-1, -1), 2.5),
        ]
        span_set = {r + 1 for r in spans}
        if zebra:
            shade = False
            for r in range(1, len(data)):
                if r in span_set:
                    shade = False
                    continue
                if shade:
                    cmds.append(("BACKGROUND", (0, r), (-1, r), colors.HexColor("#f3f3f3")))
                shade = not shade
        for r in span_set:
            cmds += [
                ("SPAN", (0, r), (-1, r)),
                ("BACKGROUND", (0, r), (-1, r), colors.HexColor("#dde6f0")),
                ("ALIGN", (0, r), (-1, r), "LEFT"),
            ]
        t.setStyle(TableStyle(cmds))
        head = self._open_headings()
        if keep or len(data) <= 25:
            self.story.append(KeepTogether([*head, cap, t]))
        else:
            self.story.append(KeepTogether([*head, cap]))
            self.story.append(t)
        from reportlab.platypus import Spacer

        self.story.append(Spacer(1, 8))

    def figure(self, path: Path, caption: str, width_mm: float = 172, max_height_mm: float = 200):
        from reportlab.lib.units import mm
        from reportlab.lib.utils import ImageReader
        from reportlab.platypus import Image, KeepTogether, Paragraph

        self.n_figure += 1
        cap = Paragraph(f"<b>Figure {self.n_figure}.</b> {caption}", self.st["caption"])
        if not path.exists() or path.stat().st_size == 0:
            self.story.append(
                KeepTogether(
                    [
                        Paragraph(f"[figure file {escape(str(path))} is missing]", self.st["note"]),
                        cap,
                    ]
                )
            )
            return
        iw, ih = ImageReader(str(path)).getSize()
        # keep the figures' font sizes alike: a full-width figure (plots.WIDTH inches at
        # plots' PNG dpi) gets width_mm, narrower ones proportionally less
        w = min(width_mm, width_mm * iw / (STYLE["savefig.dpi"] * WIDTH)) * mm
        h = w * ih / iw
        if h > max_height_mm * mm:
            h = max_height_mm * mm
            w = h * iw / ih
        head = self._open_headings()
        self.story.append(KeepTogether([*head, Image(str(path), width=w, height=h), cap]))

    def _open_headings(self) -> list:
        """The headings at the end of the story, taken off it, to go on the page of what
        follows them (reportlab's keepWithNext does not reach into a KeepTogether)."""
        head: list = []
        while self.story and getattr(getattr(self.story[-1], "style", None), "keepWithNext", 0):
            head.insert(0, self.story.pop())
        return head


def a4_document(buf, **meta):
    """The reports' A4 page template (margins, invariant mode: the same story gives the same
    bytes); ``meta``: the PDF's title, author, subject, creator."""
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.units import mm
    from reportlab.platypus import SimpleDocTemplate

    return SimpleDocTemplate(
        buf,
        pagesize=A4,
        leftMargin=15 * mm,
        rightMargin=15 * mm,
        topMargin=18 * mm,
        bottomMargin=16 * mm,
        invariant=1,
        **meta,
    )


def canvas_maker(header_left: str, header_right: str):
    from reportlab.lib import colors
    from reportlab.lib.units import mm
    from reportlab.pdfgen import canvas

    class NumberedCanvas(canvas.Canvas):
        """Header on every page and 'page N of M' in the footer (two passes)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._pages = []

        def showPage(self):
            self._pages.append(dict(self.__dict__))
            self._startPage()

        def save(self):
            total = len(self._pages)
            for state in self._pages:
                self.__dict__.update(state)
                self._decorate(total)
                super().showPage()
            super().save()

        def _decorate(self, total):
            w, h = self._pagesize
            self.saveState()
            self.setFont("Helvetica", 7.5)
            self.setFillColor(colors.HexColor("#555555"))
            self.drawString(18 * mm, h - 11 * mm, header_left)
            self.drawRightString(w - 18 * mm, h - 11 * mm, header_right)
            self.setStrokeColor(colors.HexColor("#999999"))
            self.setLineWidth(0.4)
            self.line(18 * mm, h - 12.5 * mm, w - 18 * mm, h - 12.5 * mm)
            self.drawCentredString(w / 2, 9 * mm, f"page {self._pageNumber} of {total}")
            self.restoreState()

    return NumberedCanvas
