"""Office documents (service/text/documents/): each built with the library that reads it,
translated with the upper-casing stand-in of tests/text/test_html_text.py (and once through
/translate_file with the tiny model), then opened again with that library and checked: every
text part changed, formatting stayed on its words, and every other archive entry is
byte-identical. Refusals: XXE, billion laughs, a zip bomb, an encrypted and a corrupt file.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import struct
import subprocess
import sys
import time
import zipfile

import docx
import openpyxl
import pptx
import pytest
from docx.opc.constants import RELATIONSHIP_TYPE
from docx.oxml import OxmlElement
from docx.oxml.ns import qn
from ebooklib import epub
from lxml import etree
from markdown_it import MarkdownIt
from odf import teletype
from odf.draw import Frame, Page, TextBox
from odf.office import Annotation
from odf.opendocument import (
    OpenDocumentPresentation,
    OpenDocumentSpreadsheet,
    OpenDocumentText,
    load,
)
from odf.presentation import FooterDecl, Notes
from odf.style import Footer, Header, MasterPage, PageLayout, Style, TableProperties, TextProperties
from odf.table import Table, TableCell, TableColumn, TableRow
from odf.text import A, Note, NoteBody, NoteCitation, P, Span
from openpyxl.cell.rich_text import CellRichText, TextBlock
from openpyxl.cell.text import InlineFont
from translate.storage import xliff, xliff2

from service.text.documents.inline import Slot, Unit
from service.text.documents.ooxml import paragraph_units
from service.text.documents.safety import open_archive
from service.text.files import UnsupportedFile, translate_file
from tests.text.test_html_text import shout
from tests.web.test_webapi import client, download, make_settings, model_dir, served  # noqa: F401
from tests.web.test_webapi import translate_file as post_file


def run(name: str, content: bytes, translate=shout) -> bytes:
    return asyncio.run(translate_file(name, content, "de", translate)).content


def recording(sent: list[str]):
    async def translate(texts: list[str]) -> list[str]:
        sent.extend(texts)
        return await shout(texts)

    return translate


def entries(content: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(content)) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist()}


def assert_only_text_parts_changed(before: bytes, after: bytes, text_parts: set[str]) -> None:
    old, new = entries(before), entries(after)
    assert list(old) == list(new)  # the same entries in the same order
    changed = {name for name in old if old[name] != new[name]}
    assert changed == text_parts


# --- docx --------------------------------------------------------------------------------------


def add_hyperlink(paragraph, text: str, url: str) -> None:
    r_id = paragraph.part.relate_to(url, RELATIONSHIP_TYPE.HYPERLINK, is_external=True)
    link = OxmlElement("w:hyperlink")
    link.set(qn("r:id"), r_id)
    run_element = OxmlElement("w:r")
    text_element = OxmlElement("w:t")
    text_element.text = text
    run_element.append(text_element)
    link.append(run_element)
    paragraph._p.append(link)


def build_docx() -> bytes:
    document = docx.Document()
    split = document.add_paragraph("Save the ")
    split.add_run("file before ")  # same formatting, another run: one sentence
    split.add_run("you close it.")
    formatted = document.add_paragraph("Click ")
    formatted.add_run("Save").bold = True
    formatted.add_run(" to keep ")
    formatted.add_run("your").italic = True
    formatted.add_run(" changes, see ")
    add_hyperlink(formatted, "the manual", "https://example.org/manual")
    formatted.add_run(".")
    table = document.add_table(rows=1, cols=2)
    table.cell(0, 0).text = "Name of the file"
    table.cell(0, 1).text = "2024"  # a number: not sent
    section = document.sections[0]
    section.header.paragraphs[0].text = "Company report"
    section.footer.paragraphs[0].text = "Confidential draft"
    document.add_comment(formatted.runs[1], text="Check this word", author="Ann")
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def test_docx_paragraphs_tables_headers_footers_comments_translated_with_runs_kept():
    source = build_docx()
    sent: list[str] = []
    result = run("report.docx", source, recording(sent))
    # A sentence spread over runs of one formatting goes as one text; formatted runs as tags.
    assert "Save the file before you close it." in sent
    assert (
        "Click <mt-g2>Save</mt-g2> to keep <mt-g4>your</mt-g4> changes, see <mt-g6>the manual</mt-g6>."
        in sent
    )
    assert "2024" not in sent

    document = docx.Document(io.BytesIO(result))
    split, formatted = document.paragraphs[0], document.paragraphs[1]
    assert split.text == "SAVE THE FILE BEFORE YOU CLOSE IT."
    assert formatted.text == "CLICK SAVE TO KEEP YOUR CHANGES, SEE THE MANUAL."
    assert [r.text for r in formatted.runs if r.bold] == ["SAVE"]
    assert [r.text for r in formatted.runs if r.italic] == ["YOUR"]
    [link] = formatted.hyperlinks
    assert (link.text, link.address) == ("THE MANUAL", "https://example.org/manual")
    cells = document.tables[0].rows[0].cells
    assert [cells[0].text, cells[1].text] == ["NAME OF THE FILE", "2024"]
    section = document.sections[0]
    assert section.header.paragraphs[0].text == "COMPANY REPORT"
    assert section.footer.paragraphs[0].text == "CONFIDENTIAL DRAFT"
    assert [c.text for c in document.comments] == ["CHECK THIS WORD"]
    assert_only_text_parts_changed(
        source,
        result,
        {"word/document.xml", "word/header1.xml", "word/footer1.xml", "word/comments.xml"},
    )


def test_docx_footnotes_endnotes_and_text_boxes_are_translated():
    source = build_docx()
    files = entries(source)
    w = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
    # python-docx cannot write notes or text boxes: the part and the text box are added by hand.
    files["word/footnotes.xml"] = (
        f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n<w:footnotes {w}>'
        '<w:footnote w:id="1"><w:p><w:r><w:footnoteRef/></w:r>'
        '<w:r><w:t xml:space="preserve"> See the appendix.</w:t></w:r></w:p></w:footnote>'
        "</w:footnotes>"
    ).encode()
    body = files["word/document.xml"].decode()
    box = (
        "<w:p><w:r><w:t>Before</w:t></w:r><w:r><w:pict><w:txbxContent><w:p><w:r>"
        "<w:t>Text in a box</w:t></w:r></w:p></w:txbxContent></w:pict></w:r></w:p>"
    )
    files["word/document.xml"] = body.replace("<w:sectPr", box + "<w:sectPr", 1).encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    sent: list[str] = []
    result = entries(run("notes.docx", out.getvalue(), recording(sent)))
    assert "See the appendix." in sent and "Text in a box" in sent and "Before" in sent
    assert b"> SEE THE APPENDIX.</w:t>" in result["word/footnotes.xml"]
    assert b"<w:footnoteRef/>" in result["word/footnotes.xml"]
    assert b"<w:t>TEXT IN A BOX</w:t>" in result["word/document.xml"]


# --- pptx --------------------------------------------------------------------------------------


def build_pptx() -> bytes:
    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[5])  # title only
    slide.shapes.title.text = "Quarterly results"
    box = slide.shapes.add_textbox(0, 0, 100, 100).text_frame
    paragraph = box.paragraphs[0]
    paragraph.add_run().text = "Sales grew in "
    bold = paragraph.add_run()
    bold.text = "every region"
    bold.font.bold = True
    paragraph.add_run().text = " this year, "
    italic = paragraph.add_run()
    italic.text = "again"
    italic.font.italic = True
    paragraph.add_run().text = ", see "
    link = paragraph.add_run()
    link.text = "the report"
    link.hyperlink.address = "https://example.org/q3"
    paragraph.add_run().text = "."
    table = slide.shapes.add_table(1, 2, 0, 0, 100, 100).table
    table.cell(0, 0).text = "North office"
    table.cell(0, 1).text = "42"
    slide.notes_slide.notes_text_frame.text = "Mention the new customers"
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def test_pptx_slides_tables_and_notes_translated_with_bold_kept():
    source = build_pptx()
    result = run("deck.pptx", source)
    slide = pptx.Presentation(io.BytesIO(result)).slides[0]
    assert slide.shapes.title.text == "QUARTERLY RESULTS"
    texts = [shape.text_frame.text for shape in slide.shapes if shape.has_text_frame]
    assert "SALES GREW IN EVERY REGION THIS YEAR, AGAIN, SEE THE REPORT." in texts
    runs = [
        r for s in slide.shapes if s.has_text_frame for p in s.text_frame.paragraphs for r in p.runs
    ]
    assert [r.text for r in runs if r.font.bold] == ["EVERY REGION"]
    assert [r.text for r in runs if r.font.italic] == ["AGAIN"]
    assert [(r.text, r.hyperlink.address) for r in runs if r.hyperlink.address] == [
        ("THE REPORT", "https://example.org/q3")
    ]
    table = next(s for s in slide.shapes if s.has_table).table
    assert [table.cell(0, 0).text, table.cell(0, 1).text] == ["NORTH OFFICE", "42"]
    assert slide.notes_slide.notes_text_frame.text == "MENTION THE NEW CUSTOMERS"
    assert_only_text_parts_changed(
        source, result, {"ppt/slides/slide1.xml", "ppt/notesSlides/notesSlide1.xml"}
    )


# --- xlsx --------------------------------------------------------------------------------------


def build_xlsx() -> bytes:
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Summary"
    sheet["A1"] = "Total revenue"
    sheet["A2"] = 1234.5
    sheet["A3"] = dt.date(2024, 5, 1)
    sheet["A4"] = "=SUM(A2:A2)"
    sheet["A5"] = CellRichText("Paid ", TextBlock(InlineFont(b=True), "in full"))
    sheet["A6"] = "Shared label"
    hidden = book.create_sheet("Internal")
    hidden["A1"] = "Shared label"  # the same shared string as Summary!A6
    hidden["A2"] = "Do not touch"
    hidden.sheet_state = "hidden"
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def test_xlsx_translates_visible_text_cells_and_leaves_numbers_formulas_hidden_sheets():
    source = build_xlsx()
    result = run("book.xlsx", source)
    book = openpyxl.load_workbook(io.BytesIO(result), rich_text=True)
    sheet, hidden = book["Summary"], book["Internal"]
    assert sheet["A1"].value == "TOTAL REVENUE"
    assert sheet["A2"].value == 1234.5
    assert sheet["A3"].value.date() == dt.date(2024, 5, 1)
    assert sheet["A4"].value == "=SUM(A2:A2)"
    rich = sheet["A5"].value
    assert str(rich) == "PAID IN FULL"
    assert [block.text for block in rich if isinstance(block, TextBlock) and block.font.b] == [
        "IN FULL"
    ]
    assert sheet["A6"].value == "SHARED LABEL"
    assert [hidden["A1"].value, hidden["A2"].value] == ["Shared label", "Do not touch"]
    assert hidden.sheet_state == "hidden"


def test_xlsx_shared_string_also_used_by_a_hidden_sheet_is_copied_for_the_visible_one():
    # openpyxl writes inline strings; Excel writes shared strings, built here by hand.
    files = entries(build_xlsx())
    x = 'xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"'
    files["xl/sharedStrings.xml"] = (
        f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n<sst {x} count="3" '
        'uniqueCount="2"><si><t>Shared label</t></si><si><t>Only visible</t></si></sst>'
    ).encode()
    for name, rows in (
        ("xl/worksheets/sheet1.xml", '<c r="A1" t="s"><v>0</v></c><c r="B1" t="s"><v>1</v></c>'),
        ("xl/worksheets/sheet2.xml", '<c r="A1" t="s"><v>0</v></c>'),
    ):
        files[name] = (
            f'<worksheet {x}><sheetData><row r="1">{rows}</row></sheetData></worksheet>'
        ).encode()
    types = files["[Content_Types].xml"].decode()
    files["[Content_Types].xml"] = types.replace(
        "</Types>",
        '<Override PartName="/xl/sharedStrings.xml" ContentType="application/'
        'vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"/></Types>',
    ).encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    book = openpyxl.load_workbook(io.BytesIO(run("shared.xlsx", out.getvalue())))
    assert [book["Summary"]["A1"].value, book["Summary"]["B1"].value] == [
        "SHARED LABEL",
        "ONLY VISIBLE",
    ]
    assert book["Internal"]["A1"].value == "Shared label"


# --- odt ---------------------------------------------------------------------------------------


def test_odt_paragraph_with_a_bold_span_is_one_text_and_the_span_keeps_its_words():
    document = OpenDocumentText()
    bold = Style(name="Bold", family="text")
    bold.addElement(TextProperties(fontweight="bold"))
    document.automaticstyles.addElement(bold)
    paragraph = P(text="Open the ")
    paragraph.addElement(Span(stylename=bold, text="settings"))
    paragraph.addText(" menu now.")
    document.text.addElement(paragraph)
    out = io.BytesIO()
    document.save(out)
    sent: list[str] = []
    result = run("letter.odt", out.getvalue(), recording(sent))
    assert sent == ["Open the <mt-g2>settings</mt-g2> menu now."]
    loaded = load(io.BytesIO(result))
    [translated] = loaded.getElementsByType(P)
    assert teletype.extractText(translated) == "OPEN THE SETTINGS MENU NOW."
    [span] = loaded.getElementsByType(Span)
    assert teletype.extractText(span) == "SETTINGS"
    assert_only_text_parts_changed(out.getvalue(), result, {"content.xml"})


def bold_style(document) -> Style:
    bold = Style(name="Bold", family="text")
    bold.addElement(TextProperties(fontweight="bold"))
    document.automaticstyles.addElement(bold)
    return bold


def text_of(element) -> str:
    return teletype.extractText(element)


def build_odt() -> bytes:
    document = OpenDocumentText()
    bold = bold_style(document)
    layout = PageLayout(name="Page")
    document.automaticstyles.addElement(layout)
    master = MasterPage(name="Standard", pagelayoutname=layout)
    header, footer = Header(), Footer()
    header.addElement(P(text="Company report"))
    footer.addElement(P(text="Confidential draft"))
    master.addElement(header)
    master.addElement(footer)
    document.masterstyles.addElement(master)
    formatted = P(text="Click ")
    formatted.addElement(Span(stylename=bold, text="Save"))
    formatted.addText(" to keep your changes, see ")
    formatted.addElement(A(href="https://example.org/manual", text="the manual"))
    formatted.addText(".")
    document.text.addElement(formatted)
    table = Table(name="Files")
    table.addElement(TableColumn(numbercolumnsrepeated=2))
    row = TableRow()
    name_cell = TableCell(valuetype="string")
    name_cell.addElement(P(text="Name of the file"))
    number_cell = TableCell(valuetype="float", value="2024")
    number_cell.addElement(P(text="2024"))
    row.addElement(name_cell)
    row.addElement(number_cell)
    table.addElement(row)
    document.text.addElement(table)
    noted = P(text="The results are final.")
    note = Note(noteclass="footnote", id="ftn1")
    note.addElement(NoteCitation(text="1"))
    body = NoteBody()
    body.addElement(P(text="See the appendix."))
    note.addElement(body)
    noted.addElement(note)
    comment = Annotation()
    comment.addElement(P(text="Check this word"))
    noted.addElement(comment)
    document.text.addElement(noted)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def test_odt_body_table_header_footer_footnote_comment_and_link_translated():
    source = build_odt()
    sent: list[str] = []
    result = run("letter.odt", source, recording(sent))
    assert "Click <mt-g2>Save</mt-g2> to keep your changes, see <mt-g4>the manual</mt-g4>." in sent
    assert "2024" not in sent
    loaded = load(io.BytesIO(result))
    texts = [text_of(p) for p in loaded.getElementsByType(P)]
    for expected in [
        "CLICK SAVE TO KEEP YOUR CHANGES, SEE THE MANUAL.",
        "NAME OF THE FILE",
        "2024",
        "SEE THE APPENDIX.",
        "CHECK THIS WORD",
        "COMPANY REPORT",
        "CONFIDENTIAL DRAFT",
    ]:
        assert expected in texts
    assert any(text.startswith("THE RESULTS ARE FINAL.") for text in texts)
    [span] = loaded.getElementsByType(Span)
    assert text_of(span) == "SAVE"
    [link] = loaded.getElementsByType(A)
    assert (text_of(link), link.getAttribute("href")) == (
        "THE MANUAL",
        "https://example.org/manual",
    )
    assert_only_text_parts_changed(source, result, {"content.xml", "styles.xml"})


# --- odp ---------------------------------------------------------------------------------------


def build_odp() -> bytes:
    deck = OpenDocumentPresentation()
    bold = bold_style(deck)
    layout = PageLayout(name="Slide")
    deck.automaticstyles.addElement(layout)
    master = MasterPage(name="Default", pagelayoutname=layout)
    deck.masterstyles.addElement(master)
    page = Page(masterpagename=master, usefootername="ftr1")
    title = Frame(width="20cm", height="2cm", x="1cm", y="1cm")
    title_box = TextBox()
    title_box.addElement(P(text="Quarterly results"))
    title.addElement(title_box)
    page.addElement(title)
    frame = Frame(width="20cm", height="3cm", x="1cm", y="4cm")
    box = TextBox()
    paragraph = P(text="Sales grew in ")
    paragraph.addElement(Span(stylename=bold, text="every region"))
    paragraph.addText(" this year, see ")
    paragraph.addElement(A(href="https://example.org/q3", text="the report"))
    paragraph.addText(".")
    box.addElement(paragraph)
    frame.addElement(box)
    page.addElement(frame)
    table_frame = Frame(width="20cm", height="3cm", x="1cm", y="8cm")
    table = Table(name="Offices")
    table.addElement(TableColumn(numbercolumnsrepeated=2))
    row = TableRow()
    office = TableCell()
    office.addElement(P(text="North office"))
    count = TableCell()
    count.addElement(P(text="42"))
    row.addElement(office)
    row.addElement(count)
    table.addElement(row)
    table_frame.addElement(table)
    page.addElement(table_frame)
    notes = Notes()
    notes_frame = Frame(width="20cm", height="5cm", x="1cm", y="1cm")
    notes_box = TextBox()
    notes_box.addElement(P(text="Mention the new customers"))
    notes_frame.addElement(notes_box)
    notes.addElement(notes_frame)
    page.addElement(notes)
    deck.presentation.addElement(FooterDecl(name="ftr1", text="Internal use only"))
    deck.presentation.addElement(page)
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def test_odp_slides_tables_notes_and_footer_translated_with_bold_and_link_kept():
    source = build_odp()
    sent: list[str] = []
    result = run("deck.odp", source, recording(sent))
    assert (
        "Sales grew in <mt-g2>every region</mt-g2> this year, see <mt-g4>the report</mt-g4>."
        in sent
    )
    assert "42" not in sent
    loaded = load(io.BytesIO(result))
    texts = [text_of(p) for p in loaded.getElementsByType(P)]
    assert texts == [
        "QUARTERLY RESULTS",
        "SALES GREW IN EVERY REGION THIS YEAR, SEE THE REPORT.",
        "NORTH OFFICE",
        "42",
        "MENTION THE NEW CUSTOMERS",
    ]
    [span] = loaded.getElementsByType(Span)
    assert text_of(span) == "EVERY REGION"
    [link] = loaded.getElementsByType(A)
    assert (text_of(link), link.getAttribute("href")) == ("THE REPORT", "https://example.org/q3")
    [footer] = loaded.getElementsByType(FooterDecl)
    assert text_of(footer) == "INTERNAL USE ONLY"
    assert_only_text_parts_changed(source, result, {"content.xml"})


# --- ods ---------------------------------------------------------------------------------------


def build_ods() -> bytes:
    book = OpenDocumentSpreadsheet()
    bold = bold_style(book)
    hidden_style = Style(name="Hidden", family="table")
    hidden_style.addElement(TableProperties(display="false"))
    book.automaticstyles.addElement(hidden_style)

    def cell(text: str, **attributes) -> TableCell:
        element = TableCell(**attributes)
        element.addElement(P(text=text))
        return element

    summary = Table(name="Summary")
    summary.addElement(TableColumn(numbercolumnsrepeated=2))
    rows = [
        [
            cell("Total revenue", valuetype="string"),
            cell("1234.5", valuetype="float", value="1234.5"),
        ],
        [
            cell("2024-05-01", valuetype="date", datevalue="2024-05-01"),
            cell("1234.5", valuetype="float", value="1234.5", formula="of:=SUM([.B1])"),
        ],
    ]
    rich = TableCell(valuetype="string")
    paragraph = P(text="Paid ")
    paragraph.addElement(Span(stylename=bold, text="in full"))
    rich.addElement(paragraph)
    commented = cell("Shared label", valuetype="string")
    comment = Annotation()
    comment.addElement(P(text="Check the label"))
    commented.addElement(comment)
    rows.append([rich, commented])
    for cells in rows:
        row = TableRow()
        for element in cells:
            row.addElement(element)
        summary.addElement(row)
    book.spreadsheet.addElement(summary)
    internal = Table(name="Internal", stylename=hidden_style)
    row = TableRow()
    row.addElement(cell("Do not touch", valuetype="string"))
    internal.addElement(row)
    book.spreadsheet.addElement(internal)
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def test_ods_translates_visible_text_cells_and_comments_and_leaves_numbers_formulas_hidden():
    source = build_ods()
    sent: list[str] = []
    result = run("book.ods", source, recording(sent))
    assert "Paid <mt-g2>in full</mt-g2>" in sent
    assert not {"1234.5", "2024-05-01", "Do not touch"} & set(sent)
    loaded = load(io.BytesIO(result))
    summary, internal = loaded.getElementsByType(Table)
    cells = [
        [text_of(p) for p in c.getElementsByType(P)] for c in summary.getElementsByType(TableCell)
    ]
    assert cells == [
        ["TOTAL REVENUE"],
        ["1234.5"],
        ["2024-05-01"],
        ["1234.5"],
        ["PAID IN FULL"],
        ["SHARED LABEL", "CHECK THE LABEL"],
    ]
    [span] = loaded.getElementsByType(Span)
    assert text_of(span) == "IN FULL"
    assert [text_of(p) for p in internal.getElementsByType(P)] == ["Do not touch"]
    assert_only_text_parts_changed(source, result, {"content.xml"})


# --- epub --------------------------------------------------------------------------------------


def build_epub() -> bytes:
    book = epub.EpubBook()
    book.set_identifier("book-1")
    book.set_title("A test book")
    book.set_language("en")
    chapter = epub.EpubHtml(title="Chapter one", file_name="ch1.xhtml", lang="en")
    chapter.content = (
        "<h1>Chapter one</h1>"
        "<p>Click <b>Save</b> to keep <i>all</i> <a href='https://example.org/m'>your changes</a>.</p>"
        "<pre>ls -l</pre>"
        "<table><tr><td>Name of the file</td><td>2024</td></tr></table>"
        "<p>Tom &amp; Jerry<sup><a href='#n1' epub:type='noteref'>1</a></sup></p>"
        "<aside epub:type='footnote' id='n1'><p>See the appendix.</p></aside>"
    )
    book.add_item(chapter)
    book.add_item(
        epub.EpubItem(uid="css", file_name="style.css", media_type="text/css", content=b"p{}")
    )
    book.toc = (epub.Link("ch1.xhtml", "Chapter one", "ch1"),)
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", chapter]
    out = io.BytesIO()
    epub.write_epub(out, book)
    return out.getvalue()


def test_epub_chapters_toc_and_nav_translated_through_the_html_path():
    source = build_epub()
    sent: list[str] = []
    result = run("book.epub", source, recording(sent))
    assert (
        'Click <b>Save</b> to keep <i>all</i> <a href="https://example.org/m">your changes</a>.'
        in sent
    )
    assert "ls -l" not in " ".join(sent)
    out = io.BytesIO(result)
    book = epub.read_epub(out)  # opens in ebooklib
    chapter = book.get_item_with_href("ch1.xhtml")
    body = etree.fromstring(chapter.get_content())
    xhtml = "{http://www.w3.org/1999/xhtml}"
    [heading] = body.iter(f"{xhtml}h1")
    assert heading.text == "CHAPTER ONE"
    paragraph = next(body.iter(f"{xhtml}p"))
    assert "".join(paragraph.itertext()) == "CLICK SAVE TO KEEP ALL YOUR CHANGES."
    assert [b.text for b in paragraph.iter(f"{xhtml}b")] == ["SAVE"]
    assert [i.text for i in paragraph.iter(f"{xhtml}i")] == ["ALL"]
    [link] = paragraph.iter(f"{xhtml}a")
    assert (link.text, link.get("href")) == ("YOUR CHANGES", "https://example.org/m")
    assert [pre.text for pre in body.iter(f"{xhtml}pre")] == ["ls -l"]
    assert [td.text for td in body.iter(f"{xhtml}td")] == ["NAME OF THE FILE", "2024"]
    texts = ["".join(p.itertext()) for p in body.iter(f"{xhtml}p")]
    assert texts[1:] == ["TOM & JERRY1", "SEE THE APPENDIX."]
    ncx = etree.fromstring(book.get_item_with_id("ncx").get_content())
    assert [t.text for t in ncx.iter("{*}text")] == ["A TEST BOOK", "CHAPTER ONE"]
    assert book.get_metadata("DC", "title")[0][0] == "A test book"  # metadata is left alone
    assert_only_text_parts_changed(
        source, result, {"EPUB/ch1.xhtml", "EPUB/nav.xhtml", "EPUB/toc.ncx"}
    )


# --- xliff -------------------------------------------------------------------------------------

XLIFF_12 = b"""<?xml version="1.0" encoding="UTF-8"?>
<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2">
<file original="ui.txt" source-language="en" datatype="plaintext"><body>
<trans-unit id="1"><source>Click <g id="1">Save</g> to keep<x id="2"/> your &amp; <ph id="3">%s</ph> \
changes.</source></trans-unit>
<trans-unit id="2"><source>Plain text</source><target state="new"></target></trans-unit>
<trans-unit id="3"><source>Done</source><target state="translated">Fertig</target></trans-unit>
<trans-unit id="4" translate="no"><source>Brand name</source></trans-unit>
<trans-unit id="5"><source>42</source></trans-unit>
</body></file></xliff>"""
XLIFF_20 = b"""<?xml version="1.0" encoding="UTF-8"?>
<xliff xmlns="urn:oasis:names:tc:xliff:document:2.0" version="2.0" srcLang="en">
<file id="f1"><unit id="u1"><originalData><data id="d1">&lt;br/&gt;</data></originalData>
<segment><source>Click <pc id="1">Save</pc> now<ph id="2" dataRef="d1"/>.</source></segment>
<segment><source>Second sentence.</source></segment></unit>
<unit id="u2"><segment state="initial"><source>Plain</source><target></target></segment></unit>
<unit id="u3" translate="no"><segment><source>Brand name</source></segment></unit>
</file></xliff>"""


def test_xliff_12_targets_filled_and_marked_translated_with_inline_codes_kept():
    sent: list[str] = []
    result = run("ui.xlf", XLIFF_12, recording(sent))
    assert sent[0] == ("Click <mt-g1>Save</mt-g1> to keep<mt-x2/> your &amp; <mt-x3/> changes.")
    store = xliff.xlifffile.parsestring(result)  # opens in translate-toolkit
    units = {unit.getid(): unit for unit in store.units}
    first = units["ui.txt\x041"]
    assert first.target == "CLICK SAVE TO KEEP YOUR & %s CHANGES."
    target = first.target_dom
    assert target.get("state") == "translated"
    assert [(etree.QName(c).localname, c.get("id")) for c in target] == [
        ("g", "1"),
        ("x", "2"),
        ("ph", "3"),
    ]
    assert target[0].text == "SAVE" and target[2].text == "%s"  # native code kept
    assert units["ui.txt\x042"].target == "PLAIN TEXT"
    assert units["ui.txt\x043"].target == "Fertig"  # a translator's work is kept
    assert units["ui.txt\x044"].target is None  # translate="no"
    assert units["ui.txt\x045"].target == "42"
    assert store.units[0].xmlelement.getparent().getparent().get("target-language") == "de"


def test_xliff_20_segments_filled_with_pc_and_ph_kept():
    result = run("ui.xliff", XLIFF_20)
    store = xliff2.Xliff2File.parsestring(result)
    root = etree.fromstring(result)
    ns = "{urn:oasis:names:tc:xliff:document:2.0}"
    segments = list(root.iter(f"{ns}segment"))
    targets = [segment.find(f"{ns}target") for segment in segments]
    assert ["".join(t.itertext()) if t is not None else None for t in targets] == [
        "CLICK SAVE NOW.",
        "SECOND SENTENCE.",
        "PLAIN",
        None,
    ]
    assert [s.get("state") for s in segments[:3]] == ["translated"] * 3
    assert [(etree.QName(c).localname, dict(c.attrib)) for c in targets[0]] == [
        ("pc", {"id": "1"}),
        ("ph", {"id": "2", "dataRef": "d1"}),
    ]
    assert root.get("trgLang") == "de"
    assert [unit.target for unit in store.units] == [  # as translate-toolkit reads them
        "CLICK SAVE NOW.",
        "SECOND SENTENCE.",
        "PLAIN",
        None,
    ]


def test_xliff_codes_the_translation_moves_or_loses_are_kept():
    async def reorder(texts: list[str]) -> list[str]:
        # The model puts the bold word first and forgets the standalone code.
        return ["<mt-g1>Sichern</mt-g1> klicken, um Ihre &amp; <mt-x3/> Änderungen zu behalten."]

    xml = XLIFF_12.replace(b'<trans-unit id="2">', b'<trans-unit id="2" translate="no">')
    result = asyncio.run(translate_file("ui.xlf", xml, "de", reorder)).content
    target = xliff.xlifffile.parsestring(result).units[0].target_dom
    assert [etree.QName(c).localname for c in target] == ["g", "ph", "x"]  # x appended
    assert "".join(target.itertext()) == "Sichern klicken, um Ihre & %s Änderungen zu behalten."


# --- markdown ----------------------------------------------------------------------------------

MARKDOWN = """# Getting started

Install the **package** with `pip install mt` and read
[the manual](https://example.org/guide "Guide") before you *start*.

> Quoted text stays quoted.

- First item with ![logo](img/logo.png)
- Second item<br>with HTML and <https://example.org>

```python
print("code stays")
```

    indented code stays

<div class="note">An HTML block stays.</div>

| Name | Value |
|------|-------|
| Speed | 42 |

Setext heading
==============

Line with a hard break\\
and more text.
"""


def markdown_tokens(source: str) -> list:
    parser = MarkdownIt("commonmark").enable("table").enable("strikethrough")
    flat = []
    for token in parser.parse(source):
        flat.append(token)
        flat.extend(token.children or [])
    # A paragraph comes back on one line: its soft breaks (rendered as spaces) are gone.
    return [token for token in flat if token.type != "softbreak"]


def test_markdown_text_translated_and_code_links_images_html_kept():
    sent: list[str] = []
    result = run("readme.md", MARKDOWN.encode(), recording(sent)).decode()
    assert (
        "Install the <mt-g1>package</mt-g1> with <mt-x2/> and read <mt-g3>the manual</mt-g3> "
        "before you <mt-g4>start</mt-g4>." in sent
    )
    before, after = markdown_tokens(MARKDOWN), markdown_tokens(result)
    # The same structure: every block and inline token in the same order, of the same type.
    assert [t.type for t in before] == [t.type for t in after]
    for old, new in zip(before, after, strict=True):
        if old.type in ("fence", "code_block", "html_block", "code_inline", "html_inline"):
            assert new.content == old.content  # code and HTML byte for byte
        elif old.type in ("link_open", "image"):
            assert new.attrs == old.attrs  # targets, titles and image sources
        elif old.type == "text" and any(c.isalpha() for c in old.content):
            # Every text part changed; an image's alt text and an autolink are kept whole.
            kept = old.content in ("logo", "https://example.org")
            assert new.content.strip() == (old.content if kept else old.content.upper()).strip()
    assert '```python\nprint("code stays")\n```' in result
    assert "    indented code stays" in result
    assert "| SPEED | 42 |" in result
    assert "INSTALL THE **PACKAGE** WITH `pip install mt` AND READ" in result


def test_markdown_emphasis_moves_with_its_words():
    async def reorder(texts: list[str]) -> list[str]:
        return ["Lesen Sie <mt-g2>das Handbuch</mt-g2>, <mt-g1>bitte</mt-g1>."]

    source = "Please *read* [the manual](https://example.org/m).\n"
    result = asyncio.run(translate_file("a.md", source.encode(), "de", reorder)).content
    assert result.decode() == "Lesen Sie [das Handbuch](https://example.org/m), *bitte*.\n"


# --- the unit itself ---------------------------------------------------------------------------


def test_reordered_tags_keep_formatting_on_their_words():
    p = etree.fromstring(
        '<w:p xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
        "<w:r><w:t>the </w:t></w:r><w:r><w:rPr><w:b/></w:rPr><w:t>red</w:t></w:r>"
        "<w:r><w:t xml:space='preserve'> car</w:t></w:r></w:p>"
    )
    [unit] = paragraph_units(p, "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}t")
    assert isinstance(unit, Unit) and unit.source()[1] == "the <mt-g2>red</mt-g2> car"
    unit.write("la voiture <mt-g2>rouge</mt-g2>")  # the model moves the bold word
    texts = [t.text for t in p.iter("{*}t")]
    assert texts == ["la voiture ", "rouge", None]


def test_a_paragraph_of_many_alternating_runs_is_read_and_written_in_linear_time():
    # 40,000 runs alternating plain and bold: a scan per piece of text made writing back
    # quadratic (tens of seconds here); linear, it takes about a second.
    paragraph = etree.Element("p")
    slots = []
    for index in range(40_000):
        run = etree.SubElement(paragraph, "r")
        run.text = f"word{index} "
        slots.append(Slot(run, "text", ("b",) if index % 2 else (), bare=not index % 2))
    unit = Unit(slots)
    before = "".join(run.text for run in paragraph)
    started = time.perf_counter()
    _, text, _ = unit.source()
    unit.write(text)  # its own text back: the paragraph has the same words, in order
    assert time.perf_counter() - started < 8
    assert "".join(run.text or "" for run in paragraph).split() == before.split()


# --- refusals ----------------------------------------------------------------------------------


def replace_part(content: bytes, name: str, data: bytes) -> bytes:
    files = entries(content)
    files[name] = data
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for entry, value in files.items():
            archive.writestr(entry, value)
    return out.getvalue()


XXE = b"""<?xml version="1.0"?>
<!DOCTYPE w:document [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">
<w:body><w:p><w:r><w:t>&xxe;</w:t></w:r></w:p></w:body></w:document>"""
LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;">]>
<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">
<w:body><w:p><w:r><w:t>&lol2;</w:t></w:r></w:p></w:body></w:document>"""


def zip_bomb() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("word/document.xml", b"\0" * (8 * 1024 * 1024))
    return out.getvalue()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: replace_part(build_docx(), "word/document.xml", XXE), "entities"),
        (lambda: replace_part(build_docx(), "word/document.xml", LAUGHS), "entities"),
        (zip_bomb, "zip bomb"),
        (lambda: build_docx()[:5000], "corrupt"),
        (lambda: b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 600, "encrypted"),
        (lambda: replace_part(build_docx(), "word/document.xml", b"<w:document"), "well-formed"),
    ],
    ids=["xxe", "billion-laughs", "zip-bomb", "truncated", "encrypted", "malformed"],
)
def test_hostile_or_broken_documents_are_refused(make, message):
    with pytest.raises(UnsupportedFile, match=message):
        run("evil.docx", make())


XXE_XLIFF = b"""<?xml version="1.0"?>
<!DOCTYPE xliff [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2"><file original="a"
source-language="en" datatype="plaintext"><body><trans-unit id="1"><source>&xxe;</source>
</trans-unit></body></file></xliff>"""
XXE_XHTML = b"""<?xml version="1.0"?>
<!DOCTYPE html [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<html xmlns="http://www.w3.org/1999/xhtml"><body><p>&xxe;</p></body></html>"""


def epub_bomb() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("mimetype", b"application/epub+zip")
        archive.writestr("EPUB/ch1.xhtml", b" " * (8 * 1024 * 1024))
    return out.getvalue()


@pytest.mark.parametrize(
    ("name", "make", "message"),
    [
        ("evil.epub", lambda: replace_part(build_epub(), "EPUB/ch1.xhtml", XXE_XHTML), "entities"),
        ("bomb.epub", epub_bomb, "zip bomb"),
        ("broken.epub", lambda: build_epub()[:1500], "corrupt"),
        ("odd.epub", lambda: replace_part(build_epub(), "META-INF/container.xml", b"<c"), "well"),
        ("evil.xlf", lambda: XXE_XLIFF, "entities"),
        ("broken.xliff", lambda: XLIFF_20[:300], "well-formed"),
        ("latin1.md", lambda: "Caf\xe9 au lait".encode("latin-1"), "not UTF-8"),
    ],
    ids=[
        "epub-xxe",
        "epub-zip-bomb",
        "epub-truncated",
        "epub-bad-container",
        "xliff-xxe",
        "xliff-truncated",
        "markdown-not-utf8",
    ],
)
def test_hostile_or_broken_epub_xliff_markdown_are_refused(name, make, message):
    with pytest.raises(UnsupportedFile, match=message):
        run(name, make())


def lying_zip(method: int, declared: int, inflated: int) -> bytes:
    """A .docx whose one entry declares ``declared`` bytes and inflates to ``inflated``: the
    central directory's and local header's sizes are rewritten after the entry is written."""
    out = io.BytesIO()
    block = b"\0" * (1 << 20)
    with (
        zipfile.ZipFile(out, "w", method) as archive,
        archive.open("word/document.xml", "w", force_zip64=False) as entry,
    ):
        for _ in range(inflated >> 20):
            entry.write(block)
    content = bytearray(out.getvalue())
    real = struct.pack("<I", inflated)
    local = content.index(b"PK\x03\x04")
    central = content.index(b"PK\x01\x02")
    assert content[local + 22 : local + 26] == real  # local header: uncompressed size
    assert content[central + 24 : central + 28] == real  # central directory: the same
    content[local + 22 : local + 26] = struct.pack("<I", declared)
    content[central + 24 : central + 28] = struct.pack("<I", declared)
    return bytes(content)


def test_an_entry_that_lies_about_its_size_is_not_inflated_past_it(tmp_path):
    # 1 GiB of zeros declared as 100 bytes: under the ratio floor and the total, so only
    # bounded reading keeps the inflated stream out of memory. Measured in a fresh process.
    bomb = tmp_path / "bomb.docx"
    bomb.write_bytes(lying_zip(zipfile.ZIP_DEFLATED, 100, 1 << 30))
    script = (
        "import resource, sys\n"
        "from service.text.documents.safety import open_archive\n"
        "from service.errors import UnsupportedFile\n"
        "content = open(sys.argv[1], 'rb').read()\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        "    open_archive(content, 'docx')\n"
        "    print('accepted')\n"
        "except UnsupportedFile as error:\n"
        "    print('refused', error)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(bomb)], capture_output=True, text=True, timeout=120
    )
    verdict, growth_mb = result.stdout.strip().splitlines()
    assert verdict.startswith("refused") and "corrupt" in verdict, result.stderr
    assert int(growth_mb) < 64


def test_entries_compressed_with_other_methods_than_stored_or_deflate_are_refused():
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_BZIP2) as archive:
        archive.writestr("word/document.xml", b"<w:document/>")
    with pytest.raises(UnsupportedFile, match="compression method"):
        open_archive(out.getvalue(), "docx")


# --- through the service -----------------------------------------------------------------------


def test_docx_through_translate_file_with_the_tiny_model(client):  # noqa: F811
    document = docx.Document()
    document.add_paragraph("Save the file")
    formatted = document.add_paragraph("Open ")
    formatted.add_run("the window").bold = True
    document.sections[0].header.paragraphs[0].text = "Close all files"
    out = io.BytesIO()
    document.save(out)
    name, content = download(client, post_file(client, "plain.docx", out.getvalue()))
    assert name.endswith(".docx")
    result = docx.Document(io.BytesIO(content))
    expected = served(client, ["Save the file", "Close all files"])
    assert result.paragraphs[0].text == expected[0]
    assert result.sections[0].header.paragraphs[0].text == expected[1]
    runs = result.paragraphs[1].runs
    assert [bool(r.bold) for r in runs] == [False, True]  # the runs and their formatting stay
    assert result.paragraphs[1].text != "Open the window"
    assert_only_text_parts_changed(
        out.getvalue(), content, {"word/document.xml", "word/header1.xml"}
    )


@pytest.mark.parametrize(
    ("name", "make", "message"),
    [
        ("bomb.xlsx", zip_bomb, "zip bomb"),
        ("bomb.epub", epub_bomb, "zip bomb"),
        ("evil.xliff", lambda: XXE_XLIFF, "entities"),
        ("broken.epub", lambda: build_epub()[:1500], "corrupt"),
    ],
)
def test_translate_file_refuses_bombs_entities_and_corrupt_files_with_400(
    client,  # noqa: F811
    name,
    make,
    message,
):
    response = post_file(client, name, make())
    assert response.status_code == 400 and message in response.json()["error"]


def test_frontend_settings_list_the_document_formats(client):  # noqa: F811
    formats = client.get("/frontend/settings").json()["supportedFilesFormat"]
    assert {".docx", ".pptx", ".xlsx", ".odt", ".odp", ".ods", ".epub"} <= set(formats)
    assert {".xlf", ".xliff", ".md", ".markdown"} <= set(formats)
