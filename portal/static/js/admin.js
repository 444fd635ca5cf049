// The admin view: the totals and chart of every account, the operator's margin per provider over a period, the
// accounts list and search, one account's detail with credit, debit, suspend and resume.
import { $, button, cell, confirmAction, el, labelCells, number, usd, when } from "./dom.js";
import { act, api, listGeneration } from "./api.js";
import { drawChart } from "./chart.js";
import { keyState } from "./keys.js";

const adminView = $("#view-admin");
let usersCursor = ""; // where the accounts list's next page starts
const usersList = listGeneration(); // a slow first page must not land on top of a search's answer
const totalsShown = listGeneration(); // nor slow totals on the ones asked for since (with or without internal accounts)
let detail = null; // the account on show
const detailShown = listGeneration(); // a slow earlier account's detail must not replace the one opened since
let adjustKey = null;

function restartUsers() {
  usersCursor = "";
  $("#users-table tbody").textContent = "";
  return usersList.restart();
}

export async function loadAdmin() {
  const list = restartUsers();
  const shown = totalsShown.restart();
  await act(adminView, null, async () => {
    const internal = $("#include-internal").checked ? "&include_internal=true" : "";
    const metrics = await api("GET", "/admin/metrics?days=30" + internal);
    if (!totalsShown.isCurrent(shown)) return;
    const totals = $("#admin-totals");
    totals.textContent = "";
    const t = metrics.totals;
    const perDay = new Map(metrics.series.map((d) => [d.date, { calls: d.calls, credits: d.credits_spent }]));
    drawChart($("#admin-chart"), $("#admin-chart-totals"), perDay, perDay.size);
    [
      ["Signups (30 days)", number.format(t.signups)],
      ["Active accounts", number.format(t.active_accounts)],
      ["Calls", number.format(t.calls)],
      ["Credits spent", number.format(t.credits_spent)],
      ["Revenue", usd.format(t.revenue_usd)],
      ["Upstream error rate", (metrics.upstream.error_rate * 100).toFixed(2) + " %"],
    ].forEach(([label, value]) => {
      const card = el("div", undefined, "card stat");
      card.append(el("h2", label), el("p", value, "big"));
      totals.append(card);
    });
    if (usersList.isCurrent(list)) await moreUsers();
  });
  await showMargin();
}

// The margin per provider and endpoint (GET /admin/margin) over whole UTC days, the last 30 by default; each
// provider's endpoints, then its total, then the period's.
const marginBox = $("#margin-box");
const marginShown = listGeneration(); // a slow earlier period must not replace the one asked for since
const cost = new Intl.NumberFormat("en-US", { style: "currency", currency: "USD", maximumFractionDigits: 4 });
function day(offset) {
  return new Date(Date.now() + offset * 86400000).toISOString().slice(0, 10);
}
async function showMargin() {
  if (!$("#margin-from").value) $("#margin-from").value = day(-29);
  if (!$("#margin-to").value) $("#margin-to").value = day(0);
  const shown = marginShown.restart();
  await act(marginBox, $("#margin-go"), async () => {
    const period = "from=" + encodeURIComponent($("#margin-from").value + "T00:00:00Z") +
      "&to=" + encodeURIComponent($("#margin-to").value + "T23:59:59.999Z");
    const margin = await api("GET", "/admin/margin?" + period);
    if (!marginShown.isCurrent(shown)) return;
    const body = $("#margin-table tbody");
    body.textContent = "";
    const line = (provider, endpoint, f, cls) => {
      const row = el("tr", undefined, cls);
      row.dataset.testid = "margin-row";
      cell(row, provider, "path");
      cell(row, endpoint, "path");
      cell(row, number.format(f.calls), "num");
      cell(row, cost.format(f.charged_usd) + " (" + number.format(f.charged_credits) + " credits)", "num");
      cell(row, number.format(f.provider_calls), "num");
      cell(row, number.format(f.failures), "num");
      cell(row, number.format(f.failovers), "num");
      cell(row, cost.format(f.paid_usd), "num");
      cell(row, cost.format(f.margin_usd), "num");
      body.append(row);
    };
    const name = (provider) => (provider === null ? "(none answered)" : provider);
    margin.providers.forEach((p) => {
      margin.rows.filter((r) => r.provider === p.provider).forEach((r) => line(name(p.provider), r.endpoint, r));
      line(name(p.provider), "all endpoints", p, "subtotal");
    });
    if (margin.rows.length) line("All providers", "all endpoints", margin.totals, "subtotal");
    $("#margin-table").hidden = margin.rows.length === 0;
    $("#margin-empty").hidden = margin.rows.length > 0;
    labelCells($("#margin-table"));
  });
}
$("#margin-period").addEventListener("submit", (event) => {
  event.preventDefault();
  showMargin();
});
async function moreUsers() {
  const list = usersList.current();
  const internal = $("#include-internal").checked ? "&include_internal=true" : "";
  const q = $("#users-q").value.trim();
  const query = "/admin/users?limit=50" + internal + (q ? "&q=" + encodeURIComponent(q) : "") +
    (usersCursor ? "&cursor=" + encodeURIComponent(usersCursor) : "");
  const page = await api("GET", query);
  if (!usersList.isCurrent(list)) return;
  const body = $("#users-table tbody");
  usersEmpty(body.rows.length + page.users.length, q, page.internal_hidden);
  page.users.forEach((u) => {
    const row = el("tr");
    row.dataset.testid = "user-row";
    const who = cell(row, "", "path");
    const open = button(u.email, "link");
    open.setAttribute("aria-label", "Open account " + u.email);
    open.addEventListener("click", () => showAccount(u.account_id));
    who.append(open);
    if (u.is_admin) who.append(" (admin)");
    if (u.suspended) who.append(" ", el("span", "suspended", "badge off"));
    cell(row, when(u.created_at));
    cell(row, u.keys.active + " active / " + u.keys.revoked + " revoked", "num");
    cell(row, number.format(u.calls), "num");
    cell(row, number.format(u.balance), "num");
    cell(row, usd.format(u.total_paid_usd), "num");
    cell(row, when(u.last_activity));
    body.append(row);
  });
  labelCells($("#users-table"));
  usersCursor = page.next_cursor;
  $("#users-more").hidden = !page.has_next_page;
}
$("#users-more").addEventListener("click", () => act(adminView, $("#users-more"), moreUsers));
$("#include-internal").addEventListener("change", loadAdmin);

// An empty list says what the filter hides, instead of showing zeros and an empty table.
function usersEmpty(count, q, hidden) {
  const note = $("#users-empty");
  note.hidden = count > 0;
  $("#users-table").hidden = count === 0;
  if (count > 0) return;
  let text = q ? "No account matches \u201c" + q + "\u201d." : "No customer accounts yet.";
  if (hidden) {
    text += " " + hidden + (hidden === 1 ? " admin or internal account is" : " admin or internal accounts are") +
      " hidden: tick \u201cInclude admins and internal accounts\u201d to list " + (hidden === 1 ? "it." : "them.");
  }
  note.textContent = text;
}
$("#users-search").addEventListener("submit", (event) => {
  event.preventDefault();
  restartUsers();
  act(adminView, $("#users-search-go"), moreUsers);
});

const detailBox = $("#account-detail");
const adjustForm = $("#adjust-form");
function fill(table, rows, draw) {
  const body = $(table + " tbody");
  body.textContent = "";
  rows.forEach((item) => {
    const row = el("tr");
    draw(row, item);
    body.append(row);
  });
  $(table).hidden = rows.length === 0;
  const holder = $(table).closest(".scroll");
  let none = holder.nextElementSibling;
  if (!none || !none.classList.contains("none-note")) {
    none = el("p", "None.", "muted none-note");
    holder.after(none);
  }
  none.hidden = rows.length > 0;
  labelCells($(table));
}
async function showAccount(accountId) {
  detailBox.hidden = false;
  const shown = detailShown.restart();
  const a = await act(detailBox, null, () => api("GET", "/admin/accounts/" + encodeURIComponent(accountId)));
  if (!a || !detailShown.isCurrent(shown)) return;
  detail = a;
  // One Idempotency-Key per intended change: a double click or a retry applies it once.
  adjustKey = crypto.randomUUID ? crypto.randomUUID() : Date.now() + "-" + Math.random().toString(36).slice(2);
  $("#detail-title").textContent = a.email + (a.suspended ? " — suspended" : "");
  const facts = $("#detail-facts");
  facts.textContent = "";
  [
    ["Account id", a.account_id],
    ["Balance", number.format(a.credits) + " credits"],
    ["Plan", a.plan],
    ["Paid", usd.format(a.total_paid_usd)],
    ["Signed up", when(a.created_at)],
    ["State", a.suspended ? "suspended: " + (a.suspended_reason || "") : "active"],
  ].forEach(([k, v]) => facts.append(el("dt", k), el("dd", v)));
  $("#suspend").hidden = a.suspended;
  $("#resume").hidden = !a.suspended;
  fill("#detail-keys", a.keys, (row, k) => {
    cell(row, k.name, "path");
    cell(row, "").append(el("code", k.prefix + "\u2026"));
    cell(row, when(k.created_at));
    cell(row, keyState(k));
  });
  fill("#detail-orders", a.orders, (row, o) => {
    cell(row, o.order_id, "path");
    cell(row, when(o.created_at));
    cell(row, usd.format(o.price_usd), "num");
    cell(row, o.status.replace("_", " "));
    cell(row, number.format(o.credits_applied), "num");
  });
  fill("#detail-calls", a.recent_calls, (row, r) => {
    cell(row, when(r.timestamp));
    cell(row, r.endpoint, "path");
    cell(row, String(r.status), "num");
    cell(row, number.format(r.credits), "num");
    cell(row, "", "path").append(el("code", r.request_id));
  });
  fill("#detail-members", a.members, (row, m) => {
    cell(row, m.email, "path");
    cell(row, m.role);
    cell(row, m.two_factor ? "on" : "off");
    cell(row, when(m.last_seen_at));
  });
  fill("#detail-audit", a.audit, (row, e) => {
    cell(row, when(e.at));
    cell(row, e.action);
    cell(row, e.actor.kind === "admin" ? "admin " + (e.actor.email || "") : e.actor.kind, "path");
    const details = Object.entries(e.details || {}).filter(([, v]) => v !== null && v !== undefined);
    cell(row, details.map(([k, v]) => k + ": " + v).join(", ") || "—", "path");
  });
  detailBox.scrollIntoView({ block: "start" });
}

async function adjust(kind, trigger) {
  const done = $("#adjust-done");
  done.hidden = true;
  const raw = $("#adjust-credits").value;
  const body = { credits: raw === "" ? null : Number(raw), reason: $("#adjust-reason").value };
  const url = "/admin/accounts/" + encodeURIComponent(detail.account_id) + "/" + kind;
  const headers = { "Idempotency-Key": adjustKey + "-" + kind };
  const result = await act(adjustForm, trigger, () => api("POST", url, body, headers));
  if (!result) return;
  adjustForm.reset();
  await showAccount(result.account_id);
  done.textContent = (kind === "credit" ? "Credited " : "Debited ") + number.format(body.credits) +
    " credits; the balance is now " + number.format(result.credits) + ".";
  done.hidden = false;
}
adjustForm.addEventListener("submit", (event) => {
  event.preventDefault();
  adjust("credit", $("#adjust-credit"));
});
$("#adjust-debit").addEventListener("click", () => adjust("debit", $("#adjust-debit")));

async function suspend(kind) {
  const a = detail;
  const reason = $("#adjust-reason").value.trim();
  if (kind === "suspend") {
    const sure = await confirmAction("Suspend " + a.email + "?",
      "Every key of this account is refused (HTTP 403) within a second, on every gateway process, until you " +
      "resume it. Reason: " + (reason || "(none written: the Reason field above is required)"), "Suspend");
    if (!sure) return;
  }
  const url = "/admin/accounts/" + encodeURIComponent(a.account_id) + "/" + kind;
  const done = await act(adjustForm, $("#" + kind), () => api("POST", url, reason ? { reason } : {}));
  if (done) {
    adjustForm.reset();
    await showAccount(a.account_id);
  }
}
$("#suspend").addEventListener("click", () => suspend("suspend"));
$("#resume").addEventListener("click", () => suspend("resume"));


