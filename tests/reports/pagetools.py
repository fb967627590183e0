"""Read the report page back: tables by id, image sources (stdlib html.parser, no extra dependency)."""

from __future__ import annotations

from html.parser import HTMLParser


class PageReader(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.images: list[str] = []
        self.links: list[str] = []
        self.scripts = 0
        self._table: str | None = None
        self._cell: list[str] | None = None
        self._row: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table":
            self._table = (a.get("id") or "").removeprefix("table-")
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
        elif tag == "img":
            self.images.append(a.get("src") or "")
        elif tag in ("a", "link"):
            self.links.append(a.get("href") or "")
        elif tag == "script":
            self.scripts += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table is not None:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def read_page(text: str) -> PageReader:
    reader = PageReader()
    reader.feed(text)
    return reader


def table_dicts(reader: PageReader, name: str) -> list[dict[str, str]]:
    head, *rows = reader.tables[name]
    return [dict(zip(head, r, strict=True)) for r in rows]
