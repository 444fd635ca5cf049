// Usage: the chart and totals per day, per endpoint and per key, the request log (filtered, a page at a time) and
// the CSV export.
import { $, $$, FEATURES, cell, el, labelCells, number, when } from "./dom.js";
import { act, api, listGeneration, state } from "./api.js";
import { drawChart } from "./chart.js";

const usageView = $("#view-usage");
let csvUrl = null;
let logCursor = ""; // where the request log's next page starts
const logList = listGeneration(); // a slow earlier search must not replace the newer one's calls
const usageLoad = listGeneration(); // nor a slow earlier period's totals the newer one's

function selectedDays() {
  return Number($('input[name="days"]:checked', usageView).value);
}

function dayKeys(days) {
  const out = [];
  const today = new Date();
  for (let i = days - 1; i >= 0; i--) {
    const d = new Date(Date.UTC(today.getUTCFullYear(), today.getUTCMonth(), today.getUTCDate() - i));
    out.push(d.toISOString().slice(0, 10));
  }
  return out;
}

export async function loadUsage() {
  const days = selectedDays();
  const load = usageLoad.restart();
  await act(usageView, $("#usage-refresh"), async () => {
    const perDay = new Map(dayKeys(days).map((d) => [d, { calls: 0, credits: 0 }]));
    const perEndpoint = new Map();
    if (FEATURES.has("usage-summary")) {
      // Totals computed by the server over every call; the request log pages through the calls themselves.
      const [byDay, byEndpoint, byKey, keys] = await Promise.all([
        api("GET", "/usage/summary?days=" + days + "&group_by=day"),
        api("GET", "/usage/summary?days=" + days + "&group_by=endpoint"),
        api("GET", "/usage/summary?days=" + days + "&group_by=key"),
        api("GET", "/keys"),
      ]);
      if (!usageLoad.isCurrent(load)) return;
      state.keys = keys;
      byDay.forEach((r) => perDay.has(r.day) && perDay.set(r.day, { calls: r.calls, credits: r.credits }));
      byEndpoint.forEach((r) => perEndpoint.set(r.endpoint, r));
      drawChart($("#usage-chart"), $("#usage-totals"), perDay, days);
      drawSaved(byDay, days);
      drawEndpoints(perEndpoint);
      drawKeyUsage(byKey);
      logFilters(perEndpoint);
      await loadLog(true);
      offerCsv([], days);
      return;
    }
    const records = await api("GET", "/usage?days=" + days + "&limit=10000");
    if (!usageLoad.isCurrent(load)) return;
    records.forEach((r) => {
      const day = perDay.get(r.timestamp.slice(0, 10));
      if (day) {
        day.calls += 1;
        day.credits += r.credits;
      }
      const e = perEndpoint.get(r.endpoint) || { calls: 0, credits: 0 };
      e.calls += 1;
      e.credits += r.credits;
      perEndpoint.set(r.endpoint, e);
    });
    drawChart($("#usage-chart"), $("#usage-totals"), perDay, days);
    if (records.length >= 10000) {
      $("#usage-totals").textContent += " Counted from the latest 10,000 calls only; the CSV has those too.";
    }
    drawEndpoints(perEndpoint);
    drawCalls(records.slice(0, 50));
    offerCsv(records, days);
  });
}
$$('input[name="days"]', usageView).forEach((r) => r.addEventListener("change", loadUsage));
$("#usage-refresh").addEventListener("click", loadUsage);

// What the answer cache saved over the period: the calls it answered and the credits they were not charged.
function drawSaved(byDay, days) {
  const calls = byDay.reduce((sum, r) => sum + (r.from_cache || 0), 0);
  const saved = byDay.reduce((sum, r) => sum + (r.credits_saved || 0), 0);
  const line = $("#usage-saved");
  line.textContent = "Saved by the cache in the last " + days + " days: " + number.format(saved) + " credits (" +
    number.format(calls) + (calls === 1 ? " call" : " calls") + " answered from the cache).";
  line.hidden = false;
}

const ms = (value) => (value === null || value === undefined ? "—" : number.format(Math.round(value)));

function drawEndpoints(perEndpoint) {
  const body = $("#endpoints-table tbody");
  body.textContent = "";
  $("#endpoints-empty").hidden = perEndpoint.size > 0;
  Array.from(perEndpoint.entries())
    .sort((a, b) => b[1].credits - a[1].credits || b[1].calls - a[1].calls)
    .forEach(([endpoint, v]) => {
      const row = el("tr");
      row.dataset.testid = "endpoint-row";
      cell(row, endpoint, "path");
      cell(row, number.format(v.calls), "num");
      cell(row, number.format(v.credits), "num");
      cell(row, v.errors === undefined ? "—" : number.format(v.errors), "num");
      cell(row, ms(v.p50_ms), "num");
      cell(row, ms(v.p95_ms), "num");
      const cached = cell(row, v.from_cache === undefined ? "—" : number.format(v.from_cache), "num");
      cached.dataset.testid = "endpoint-from-cache";
      if (v.credits_saved) cached.append(" ", el("span", "saved " + number.format(v.credits_saved), "badge off"));
      body.append(row);
    });
  labelCells($("#endpoints-table"));
}

function keyName(keyId) {
  const key = state.keys.find((k) => k.key_id === keyId);
  return key ? key.name + " (" + key.prefix + "…)" : "key " + keyId;
}

function drawKeyUsage(rows) {
  const body = $("#usage-keys-table tbody");
  body.textContent = "";
  $("#usage-keys-empty").hidden = rows.length > 0;
  rows.forEach((r) => {
    const row = el("tr");
    row.dataset.testid = "key-usage-row";
    cell(row, keyName(r.key_id), "path");
    cell(row, number.format(r.calls), "num");
    cell(row, number.format(r.credits), "num");
    cell(row, number.format(r.errors), "num");
    body.append(row);
  });
  labelCells($("#usage-keys-table"));
}

// The request log: GET /usage/log, filtered, newest first, a page at a time.
const logForm = $("#log-form");
function logFilters(perEndpoint) {
  const keySelect = $("#log-key");
  const endpointSelect = $("#log-endpoint");
  const keep = [keySelect.value, endpointSelect.value];
  keySelect.length = 1;
  endpointSelect.length = 1;
  state.keys.forEach((k) => {
    const option = el("option", keyName(k.key_id) + (k.revoked ? " — revoked" : ""));
    option.value = k.key_id;
    keySelect.append(option);
  });
  Array.from(perEndpoint.keys()).sort().forEach((endpoint) => {
    const option = el("option", endpoint);
    option.value = endpoint;
    endpointSelect.append(option);
  });
  keySelect.value = keep[0];
  endpointSelect.value = keep[1];
  if (keySelect.value !== keep[0]) keySelect.value = "";
  if (endpointSelect.value !== keep[1]) endpointSelect.value = "";
}

async function loadLog(reset) {
  if (reset) logCursor = "";
  const list = reset ? logList.restart() : logList.current();
  const days = selectedDays();
  const query = new URLSearchParams({ limit: "50" });
  const requestId = $("#log-request").value.trim();
  // A request id is looked for in the whole history; the other filters within the period chosen above.
  query.set("since", requestId ? "1970-01-01T00:00:00+00:00" : new Date(Date.now() - days * 86400000).toISOString());
  [["key_id", "#log-key"], ["endpoint", "#log-endpoint"], ["status", "#log-status"], ["via", "#log-via"]].forEach(([name, sel]) => {
    if ($(sel).value) query.set(name, $(sel).value);
  });
  if (requestId) query.set("request_id", requestId);
  if (logCursor) query.set("cursor", logCursor);
  const page = await api("GET", "/usage/log?" + query.toString());
  if (!logList.isCurrent(list)) return;
  drawCalls(page.records, !reset);
  logCursor = page.next_cursor;
  $("#log-more").hidden = !page.has_next_page;
  $("#log-scope").textContent = requestId
    ? "The call with request id " + requestId + " (and its replays), whenever it was made."
    : "Calls of the last " + days + " days, newest first, 50 at a time.";
}
logForm.addEventListener("submit", (event) => {
  event.preventDefault();
  act(logForm, $("#log-search"), () => loadLog(true));
});
$("#log-more").addEventListener("click", () => act(logForm, $("#log-more"), () => loadLog(false)));

function drawCalls(records, append) {
  const body = $("#calls-table tbody");
  if (!append) body.textContent = "";
  $("#calls-empty").hidden = body.rows.length + records.length > 0;
  records.forEach((r) => {
    const row = el("tr");
    row.dataset.testid = "usage-row";
    cell(row, when(r.timestamp));
    const endpoint = cell(row, r.endpoint, "path");
    if (r.via === "mcp") {
      // A tool call of an AI agent (the MCP server): the REST endpoint it called, and the tool.
      row.dataset.via = "mcp";
      endpoint.append(" ", el("span", "MCP · " + r.tool, "badge mcp"));
    }
    cell(row, keyName(r.key_id), "path");
    cell(row, String(r.status), "num");
    const credits = cell(row, number.format(r.credits), "num");
    if (r.cache === "hit" || r.cache === "stale") {
      // Answered from the shared answer cache: no provider call, and the credits that saved.
      const how = r.cache === "stale" ? "stale (provider down)" : "from cache";
      credits.append(" ", el("span", how + ", saved " + number.format(r.credits_saved || 0), "badge off"));
    }
    cell(row, r.upstream_ms === undefined ? "—" : ms(r.upstream_ms) + (r.upstream_ms === null ? "" : " ms"), "num");
    const id = cell(row, "", "path");
    id.append(el("code", r.request_id));
    if (r.replay_of) {
      // A repeat answered with the first answer to its Idempotency-Key: 0 credits, the first call's id.
      row.dataset.replay = "true";
      id.append(" ", el("span", "replay of", "badge off"), " ", el("code", r.replay_of));
    }
    body.append(row);
  });
  labelCells($("#calls-table"));
}

function csvField(value) {
  const text = String(value === null || value === undefined ? "" : value);
  return /[",\n]/.test(text) ? '"' + text.replace(/"/g, '""') + '"' : text;
}
function offerCsv(records, days) {
  const link = $("#usage-csv");
  if (FEATURES.has("usage-export")) {
    link.href = "/usage/export?days=" + days;
    link.setAttribute("download", ""); // the server names the file
    return;
  }
  const lines = [["timestamp", "endpoint", "status", "credits", "key_id", "request_id", "replay_of"].join(",")];
  records.forEach((r) =>
    lines.push([r.timestamp, r.endpoint, r.status, r.credits, r.key_id, r.request_id, r.replay_of].map(csvField).join(",")));
  if (csvUrl) URL.revokeObjectURL(csvUrl);
  csvUrl = URL.createObjectURL(new Blob([lines.join("\n") + "\n"], { type: "text/csv" }));
  link.href = csvUrl;
  link.download = "usage-" + days + "d.csv";
}

