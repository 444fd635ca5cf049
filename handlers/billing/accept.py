"""Which form of a billing document a request's Accept header asks for (RFC 9110 12.5.1), one rule for receipts,
credit notes and statements: JSON unless a document type (PDF, CSV) is named with a q above 0 and JSON is ranked
no higher; among document types the highest q, the first named on a tie. JSON's q is that of `application/json`,
else `application/*`, else `*/*`, so `*/*` alone, a browser's default and no header are JSON."""

JSON, PDF, CSV = "application/json", "application/pdf", "text/csv"


def _weight(params: list[str]) -> float:
    """A media range's `q`: 1 when absent; one that is not a number counts as absent."""
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                return min(max(float(value), 0.0), 1.0)
            except ValueError:
                return 1.0
    return 1.0


def negotiate(accept: str, documents: tuple[str, ...]) -> str:
    """JSON, or one of `documents` (the media types this answer can also be)."""
    ranges: dict[str, float] = {}
    for part in accept.split(","):
        media, *params = part.split(";")
        ranges.setdefault(media.strip().lower(), _weight(params))  # a range named twice: its first weight
    json = next((ranges[r] for r in (JSON, "application/*", "*/*") if r in ranges), 0.0)
    best, best_q = JSON, 0.0
    for media, q in ranges.items():  # in the order named
        if media in documents and q > best_q:
            best, best_q = media, q
    return best if best_q > 0 and best_q >= json else JSON
