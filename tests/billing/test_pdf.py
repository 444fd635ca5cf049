"""The billing documents' PDF renderer (billing/pdf.py), read back with poppler's pdftotext as a reader would see it.

Without poppler-utils (`apt-get install -y poppler-utils`) these tests are skipped with the reason."""

import shutil
import subprocess

import pytest

from billing import pdf
from billing.pdf import Column, Document, Party, Table, render

pytestmark = pytest.mark.skipif(
    shutil.which("pdftotext") is None, reason="pdftotext missing: apt-get install -y poppler-utils"
)

LONG_ADDRESS = "Unit 4, The Very Long Industrial Estate Road, Somewhere-upon-a-River, County of Examples, AB1 2CD"
LONG_EMAIL = "accounts-payable-department-of-the-company@an-extremely-long-domain-name-for-billing.example.com"


def document(customer: str = "Example GmbH", **changes) -> Document:
    fields = dict(
        operator="Acme Data Ltd",
        title="Receipt R-2026-000123",
        parties=(
            Party("Issued by", ("Acme Data Ltd", LONG_ADDRESS, "VAT GB123456789")),
            Party("Billed to", (customer, "Hauptstraße 1, Berlin", "DE", LONG_EMAIL)),
        ),
        facts=(("Date", "2026-03-01"), ("Order", "ord_0123456789abcdef0123")),
        table=Table(
            (Column("Description", width=3), Column("Credits", amount=True), Column("USD", amount=True)),
            [("Top-up", 123_456_789, 1_234_567.5)],
        ),
        totals=(("Total paid (USD)", 1_234_567.5),),
        notes=("Prepaid credits.",),
        footer="Acme Data Ltd · registered in England no. 0123456",
    )
    fields.update(changes)
    return Document(**fields)


def text_of(data: bytes, tmp_path, layout: bool = False) -> str:
    path = tmp_path / "doc.pdf"
    path.write_bytes(data)
    args = ["pdftotext", *(["-layout"] if layout else []), str(path), "-"]
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


@pytest.mark.parametrize("paper", ["A4", "Letter"])
def test_the_reader_sees_the_issuer_the_number_and_amounts_with_separators(paper, tmp_path):
    data = render(document(), paper)
    assert data.startswith(b"%PDF")
    text = text_of(data, tmp_path)
    for expected in ("Acme Data Ltd", "Receipt R-2026-000123", "123,456,789", "1,234,567.50", "page 1 of 1"):
        assert expected in text
    # Long lines wrap inside their column: every character is on the page, none cut off at the edge.
    flat = "".join(text.split())
    assert "".join(LONG_ADDRESS.split()) in flat and LONG_EMAIL in flat


def test_amount_columns_are_right_aligned(tmp_path):
    rows = [("small", 5, 1.0), ("large", 123_456_789, 1_234_567.5)]
    doc = document(
        table=Table((Column("What", width=3), Column("Credits", amount=True), Column("USD", amount=True)), rows)
    )
    lines = text_of(render(doc), tmp_path, layout=True).splitlines()
    small, large = next(x for x in lines if x.startswith("small")), next(x for x in lines if x.startswith("large"))
    assert len(small.rstrip()) == len(large.rstrip())  # both end at the column's right edge
    assert small.rstrip().endswith(" 1.00") and large.rstrip().endswith("1,234,567.50")


@pytest.mark.parametrize("name", ["Łódź Ηλίας Сергей Прокофьев", "Հայաստան საქართველო Łódź"])
def test_names_outside_latin_1_print_as_given(name, tmp_path):
    if not any({ord(c) for c in name if c != " "} <= font.covers for font in pdf._fonts()):
        pytest.skip("no font for these scripts: apt-get install -y fonts-liberation fonts-dejavu-core")
    assert name in text_of(render(document(customer=name)), tmp_path)


def test_without_a_font_other_scripts_fall_back_and_never_fail(tmp_path, monkeypatch):
    monkeypatch.setattr(pdf, "_fonts", lambda: ())
    text = text_of(render(document(customer="Őrs Łukasz Ηλίας 株式会社 — €5")), tmp_path)
    assert "Ors ?ukasz ????? ???? — €5" in text  # Ő without its accent; Windows-1252 kept as is


def test_a_long_table_continues_on_the_next_page_with_its_header(tmp_path):
    rows = [(f"/social/endpoint/{i}", i, float(i)) for i in range(120)]
    table = Table((Column("Endpoint", width=3), Column("Calls", amount=True), Column("Credits", amount=True)), rows)
    text = text_of(render(document(table=table), "Letter"), tmp_path)
    pages = text.split("\f")
    assert len([p for p in pages if p.strip()]) > 1
    assert all("Endpoint" in page for page in pages if "/social/endpoint/" in page)
    assert all(f"/social/endpoint/{i}\n" in text for i in range(120))


def test_an_unknown_paper_is_refused():
    with pytest.raises(ValueError):
        render(document(), "A5")
