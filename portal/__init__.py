"""The web portal for account holders and the interactive API docs: the page handlers (`pages.py`), the page
templates (`templates/`) and the files the browser loads (`static/`: the stylesheet and the script, ES modules one per
view in `static/js/`). It sits above `handlers/`, whose JSON API the page calls and whose sessions it shares."""
