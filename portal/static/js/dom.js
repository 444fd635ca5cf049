// What every view draws with: element lookups and builders, the one date and number format, tables, the
// confirmation dialog, copying. Nothing here talks to the API.

export const $ = (selector, root) => (root || document).querySelector(selector);
export const $$ = (selector, root) => Array.from((root || document).querySelectorAll(selector));

// The parts the page shows only when named in body[data-features] (FEATURES in portal/pages.py, and "sandbox").
export const FEATURES = new Set((document.body.dataset.features || "").split(" ").filter(Boolean));

export const number = new Intl.NumberFormat("en-US");
export const usd = new Intl.NumberFormat("en-US", { style: "currency", currency: "USD" });
export function when(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return isNaN(d) ? String(iso) : d.toISOString().slice(0, 16).replace("T", " ") + " UTC"; // one format everywhere
}

export function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (cls) node.className = cls;
  return node;
}
export function button(text, cls, testid) {
  const b = el("button", text, cls);
  b.type = "button";
  if (testid) b.dataset.testid = testid;
  return b;
}
export function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.append(td);
  return td;
}
// Each cell names its column, shown beside the value where a phone screen stacks the table (portal.css).
export function labelCells(table) {
  const names = Array.from(table.tHead.rows[0].cells).map((th) => th.textContent);
  Array.from(table.tBodies[0].rows).forEach((row) =>
    Array.from(row.cells).forEach((td, i) => (td.dataset.label = names[i] || "")));
}

// One row per item (drawRow fills it); the table's "none yet" note shows when there is none.
export function fillTable(table, empty, items, testid, drawRow) {
  const body = $(table + " tbody");
  body.textContent = "";
  $(empty).hidden = items.length > 0;
  items.forEach((item) => {
    const row = el("tr");
    row.dataset.testid = testid;
    drawRow(row, item);
    body.append(row);
  });
  labelCells($(table));
}

// An action's own error line, in the row whose button failed.
export function rowError() {
  const failed = el("p", "", "error");
  failed.dataset.testid = "error";
  failed.setAttribute("role", "alert");
  failed.hidden = true;
  return failed;
}

export function confirmAction(title, text, okLabel) {
  const dialog = $("#confirm-dialog");
  $("#confirm-title").textContent = title;
  $("#confirm-text").textContent = text;
  $("#confirm-ok").textContent = okLabel;
  dialog.returnValue = "";
  dialog.showModal();
  $("#confirm-cancel").focus();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
  });
}

export async function copy(text, status) {
  try {
    await navigator.clipboard.writeText(text);
    status.textContent = "Copied.";
  } catch (err) {
    status.textContent = "Select the text and copy it by hand.";
  }
}
