"""Text as a CSV cell a spreadsheet never opens as a formula: a cell starting with = + - @, or with a tab or carriage
return before one (OWASP, CSV injection), is quoted out of it with a leading apostrophe. Used by every CSV that
carries text an account holder or the operator typed (the audit export, the accountant's receipts)."""

FORMULA = ("=", "+", "-", "@", "\t", "\r")


def cell(value) -> str:
    """`value` as a cell: None empty, a number as written (-5 is a number, not a formula), text quoted when a
    spreadsheet would read it as a formula."""
    if value is None:
        return ""
    text = str(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return text
    return "'" + text if text.startswith(FORMULA) else text
