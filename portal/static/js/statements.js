// Monthly statements in the billing view: the newest months with their figures, each downloadable as PDF or CSV
// (GET /billing/statements/{month} with the document's media type in Accept; the server names the file).
import { $, button, cell, el, labelCells, number } from "./dom.js";
import { ApiFailure, act, api, listGeneration } from "./api.js";
import { may } from "./roles.js";

const SHOWN = 12; // months with their figures; older ones are a click on "older" away
const box = $("#statements");
const list = listGeneration(); // a slow load must not replace the one of an account switched to since
let months = [];
let shown = SHOWN;

export async function loadStatements() {
  box.hidden = !may("get /billing/statements/{month}");
  if (box.hidden) return;
  const ticket = list.restart();
  await act(box, null, async () => {
    const listed = await api("GET", "/billing/statements");
    if (!list.isCurrent(ticket)) return;
    months = listed.months;
    shown = SHOWN;
    await draw(ticket);
  });
}

async function draw(ticket) {
  const figures = await Promise.all(months.slice(0, shown).map((m) => api("GET", "/billing/statements/" + m.month)));
  if (!list.isCurrent(ticket)) return;
  const body = $("#statements-table tbody");
  body.textContent = "";
  figures.forEach((s) => {
    const row = el("tr");
    row.dataset.testid = "statement-row";
    cell(row, s.month, "path");
    cell(row, s.status === "final" ? "final" : "so far");
    for (const amount of [s.opening_balance, s.credits_added, s.credits_charged, s.credits_saved, s.closing_balance]) {
      cell(row, number.format(amount), "num");
    }
    const links = cell(row, "");
    for (const [label, media, ext] of [["PDF", "application/pdf", "pdf"], ["CSV", "text/csv", "csv"]]) {
      const get = button(label, "secondary small", "statement-" + ext);
      get.setAttribute("aria-label", label + " of the statement " + s.month);
      get.addEventListener("click", () => act(box, get, () => download(s.month, media, ext)));
      links.append(get, " ");
    }
    body.append(row);
  });
  labelCells($("#statements-table"));
  $("#statements-more").hidden = months.length <= shown;
}

// Fetched with the session's cookie and the media type asked for, then saved under the server's file name.
async function download(month, media, ext) {
  const response = await fetch("/billing/statements/" + month, { credentials: "same-origin", headers: { Accept: media } });
  if (!response.ok) {
    const body = await response.json().catch(() => null);
    const detail = body && body.detail;
    const text = Array.isArray(detail) ? detail.map((e) => e.msg).join("; ") : detail;
    throw new ApiFailure(response.status, text || "The statement could not be made (HTTP " + response.status + ").");
  }
  const named = /filename="([^"]+)"/.exec(response.headers.get("Content-Disposition") || "");
  const link = el("a");
  link.href = URL.createObjectURL(await response.blob());
  link.download = named ? named[1] : "statement-" + month + "." + ext;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
}

$("#statements-more").addEventListener("click", () =>
  act(box, $("#statements-more"), () => {
    shown += SHOWN;
    return draw(list.current());
  }));
