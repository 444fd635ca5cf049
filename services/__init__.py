"""Services: what the handlers call; each owns one area's rules over the stores below."""
