// Real time (docs/streams.md): filter rules and monitors, what one costs a day, their recent deliveries.
import { $, $$, button, cell, el, fillTable, when } from "./dom.js";
import { ApiFailure, act, api, clearError, listGeneration, showError, showRecent } from "./api.js";

const streamForm = $("#stream-form");
const LEAST_PER_POLL = 15; // the search's per-call minimum (metering/pricing.py); rows carry the server's figure
const MIN_INTERVAL = Number(document.body.dataset.streamMinInterval) || 10; // this server's STREAM_MIN_INTERVAL
// The server's own check (handlers/streams/handlers.py checked_interval), in its words: an interval it would refuse is
// neither priced nor sent.
function intervalProblem(every) {
  return every >= MIN_INTERVAL && every <= 86400 ? "" : "Choose from " + MIN_INTERVAL +
    " seconds to a day (86400): a rule is polled at most every " + MIN_INTERVAL + " seconds";
}
function streamFields() {
  const monitor = $("#stream-kind").value === "monitor";
  $$('[data-for="rule"]', streamForm).forEach((n) => (n.hidden = monitor));
  $("#stream-value-label").textContent = monitor ? "Account (@handle)" : "Search";
  $("#stream-value").name = monitor ? "x_user_name" : "value";
  $("#stream-value").placeholder = monitor ? "@handle" : "bitcoin lang:en";
  const every = Number($("#stream-interval").value);
  const problem = intervalProblem(every);
  const polls = problem ? 0 : Math.ceil(86400 / every);
  $("#stream-cost").textContent = problem ? problem + "." : "At least " + (polls * LEAST_PER_POLL).toLocaleString() + " credits a day (" + polls.toLocaleString() +
      " polls), plus each new post's price.";
}
["change", "input"].forEach((e) => streamForm.addEventListener(e, streamFields));

const streamsList = listGeneration(); // the view's slow first list must not hide a rule made (or show one deleted) since

export async function loadStreams() {
  clearError(streamForm);
  streamFields();
  const list = streamsList.restart();
  await act(streamForm, null, async () => {
    const rows = await api("GET", "/streams");
    if (streamsList.isCurrent(list)) drawStreams(rows);
  });
}

function drawStreams(rows) {
  fillTable("#streams-table", "#streams-empty", rows, "stream-row", (row, r) => {
    cell(row, (r.kind === "monitor" ? "Monitor " : r.tag + ": ") + r.value);
    cell(row, r.interval_seconds + " s");
    const word = r.status === "paused_balance" ? "paused: balance" : r.status;
    cell(row, "").append(el("span", word, r.status === "active" ? "badge" : "badge off"));
    cell(row, r.cost_per_day_credits.toLocaleString() + " credits", "num");
    cell(row, when(r.polled_at));
    const actions = cell(row, "", "actions");
    const on = r.status === "inactive";
    const toggle = button(on ? "Activate" : "Pause", "secondary small", on ? "activate-stream" : "pause-stream");
    toggle.dataset.op = "patch /streams/{rule_id}";
    toggle.addEventListener("click", async () => {
      const path = "/streams/" + r.rule_id;
      if (await act(streamForm, toggle, () => api("PATCH", path, { active: on }))) loadStreams();
    });
    const log = button("Deliveries", "secondary small", "stream-deliveries");
    log.addEventListener("click", () => showStreamEvents(r));
    const remove = button("Delete", "danger small", "delete-stream");
    remove.dataset.op = "delete /streams/{rule_id}";
    remove.setAttribute("aria-label", "Delete " + r.tag);
    remove.addEventListener("click", async () => {
      if (await act(streamForm, remove, () => api("DELETE", "/streams/" + r.rule_id))) loadStreams();
    });
    actions.append(toggle, log, remove);
  });
}

streamForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  const kind = $("#stream-kind").value;
  const raw = $("#stream-interval").value.trim();
  const body = { kind, interval_seconds: raw === "" ? null : Number(raw) };
  const problem = intervalProblem(body.interval_seconds === null ? NaN : body.interval_seconds);
  if (problem) {
    clearError(streamForm);
    showError(streamForm, new ApiFailure(422, "Interval: " + problem, ["interval_seconds"]));
    $("#stream-interval").focus();
    return;
  }
  const value = $("#stream-value").value.trim();
  if (kind === "monitor") body.x_user_name = value;
  else Object.assign(body, { tag: $("#stream-tag").value.trim() || null, value: value || null });
  if (await act(streamForm, $("#create-stream"), () => api("POST", "/streams", body))) {
    $("#stream-value").value = "";
    $("#stream-tag").value = "";
    loadStreams();
  }
});

function showStreamEvents(r) {
  const path = "/streams/" + r.rule_id + "/events?limit=50";
  return showRecent("stream-events", "Recent deliveries of " + r.tag, path, "stream-event-row", (row, e) => {
    cell(row, e.event_id);
    cell(row, String(e.tweets.length), "num");
    cell(row, e.tweets.length ? (e.tweets[0].text || "").slice(0, 80) : "—");
    cell(row, when(e.created_at));
  });
}

