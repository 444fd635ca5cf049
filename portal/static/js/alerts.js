// Alerts and webhooks: alert rules, webhook endpoints (test event, roll the secret, enable, delete) and their
// deliveries.
import { $, $$, button, cell, confirmAction, copy, el, fillTable, rowError, when } from "./dom.js";
import { act, api, clearError, listGeneration, showRecent } from "./api.js";

const ruleForm = $("#rule-form");
const endpointForm = $("#endpoint-form");
function ruleFields() {
  const kind = $("#rule-kind").value;
  const amount = kind === "balance_below" || kind === "daily_spend_above";
  $$('[data-for="amount"]', ruleForm).forEach((n) => (n.hidden = !amount));
  $$('[data-for="levels"]', ruleForm).forEach((n) => (n.hidden = kind !== "key_budget"));
  $('#rule-unit option[value="percent"]').disabled = kind !== "balance_below";
  if (kind !== "balance_below" && $("#rule-unit").value === "percent") $("#rule-unit").value = "credits";
  $("#rule-amount").name = $("#rule-unit").value;
}
$("#rule-kind").addEventListener("change", ruleFields);
$("#rule-unit").addEventListener("change", ruleFields);

export async function loadAlerts() {
  clearError(ruleForm);
  ruleFields();
  await act(ruleForm, null, async () => {
    await reloadRules();
    await reloadWebhooks();
  });
}
// The view's slow first list must not hide a rule or an endpoint made since (or show one deleted).
const rulesList = listGeneration();
const webhooksList = listGeneration();
async function reloadRules() {
  const list = rulesList.restart();
  const rules = await api("GET", "/alerts");
  if (rulesList.isCurrent(list)) drawRules(rules);
}
async function reloadWebhooks() {
  const list = webhooksList.restart();
  const endpoints = await api("GET", "/webhooks");
  if (webhooksList.isCurrent(list)) drawWebhooks(endpoints);
}

function drawRules(rules) {
  fillTable("#rules-table", "#rules-empty", rules, "rule-row", (row, rule) => {
    cell(row, rule.description);
    cell(row, "").append(el("span", rule.armed ? "armed" : "fired", rule.armed ? "badge" : "badge off"));
    cell(row, when(rule.fired_at));
    const actions = cell(row, "", "actions");
    const remove = button("Delete", "danger small", "delete-rule");
    remove.dataset.op = "delete /alerts/{rule_id}";
    remove.setAttribute("aria-label", "Delete rule " + rule.description);
    remove.addEventListener("click", async () => {
      if (await act(ruleForm, remove, () => api("DELETE", "/alerts/" + rule.rule_id))) loadAlerts();
    });
    actions.append(remove);
  });
}

ruleForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  const kind = $("#rule-kind").value;
  const body = { kind };
  if (kind === "balance_below" || kind === "daily_spend_above") {
    const unit = $("#rule-unit").value;
    const raw = $("#rule-amount").value.trim();
    body[unit] = raw === "" ? null : unit === "usd" ? Number(raw) : Math.round(Number(raw));
  }
  if (kind === "key_budget") body.levels = $$('input[name="levels"]:checked', ruleForm).map((c) => Number(c.value));
  const done = await act(ruleForm, $("#create-rule"), () => api("POST", "/alerts", body));
  if (done) {
    $("#rule-amount").value = "";
    await reloadRules();
  }
});

function drawWebhooks(endpoints) {
  const disabled = endpoints.filter((e) => !e.enabled);
  const notice = $("#webhook-notice");
  notice.textContent = disabled.map((e) => "Endpoint " + e.url + " was disabled: " + (e.disabled_reason || "")).join(" ");
  notice.hidden = disabled.length === 0;
  fillTable("#webhooks-table", "#webhooks-empty", endpoints, "endpoint-row", (row, endpoint) => {
    cell(row, endpoint.url, "url");
    const word = endpoint.enabled ? (endpoint.failing_since ? "failing" : "enabled") : "disabled";
    cell(row, "").append(el("span", word, word === "enabled" ? "badge" : "badge off"));
    cell(row, when(endpoint.created_at));
    const actions = cell(row, "", "actions");
    const test = button("Send test event", "secondary small", "test-event");
    test.dataset.op = "post /webhooks/{endpoint_id}/test";
    test.addEventListener("click", async () => {
      if (await act(actions, test, () => api("POST", "/webhooks/" + endpoint.endpoint_id + "/test"))) {
        setTimeout(() => showDeliveries(endpoint), 600);
      }
    });
    const log = button("Deliveries", "secondary small", "show-deliveries");
    log.addEventListener("click", () => showDeliveries(endpoint));
    const roll = button("Roll secret", "secondary small");
    roll.dataset.op = "post /webhooks/{endpoint_id}/roll";
    roll.addEventListener("click", async () => {
      const sure = await confirmAction("Roll the signing secret?", "A new secret is shown once; the old one keeps signing for a day.", "Roll");
      const rolled = sure && (await act(actions, roll, () => api("POST", "/webhooks/" + endpoint.endpoint_id + "/roll")));
      if (rolled) showEndpointSecret(rolled.secret);
    });
    actions.append(test, log, roll);
    if (!endpoint.enabled) {
      const enable = button("Enable", "secondary small");
      enable.dataset.op = "patch /webhooks/{endpoint_id}";
      enable.addEventListener("click", async () => {
        if (await act(actions, enable, () => api("PATCH", "/webhooks/" + endpoint.endpoint_id, { enabled: true }))) loadAlerts();
      });
      actions.append(enable);
    }
    const remove = button("Delete", "danger small");
    remove.dataset.op = "delete /webhooks/{endpoint_id}";
    remove.addEventListener("click", async () => {
      const sure = await confirmAction("Delete this endpoint?", endpoint.url + " will receive nothing more.", "Delete");
      if (sure && (await act(actions, remove, () => api("DELETE", "/webhooks/" + endpoint.endpoint_id)))) {
        $("#deliveries-box").hidden = true;
        loadAlerts();
      }
    });
    actions.append(remove);
    actions.append(rowError());
  });
}

function showEndpointSecret(secret) {
  $("#endpoint-secret").textContent = secret;
  $("#endpoint-copy-status").textContent = "";
  $("#endpoint-secret-box").hidden = false;
}
$("#copy-endpoint-secret").addEventListener("click", () =>
  copy($("#endpoint-secret").textContent, $("#endpoint-copy-status")));

endpointForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  const done = await act(endpointForm, $("#create-endpoint"), () =>
    api("POST", "/webhooks", { url: $("#endpoint-url").value.trim() }));
  if (done) {
    $("#endpoint-url").value = "";
    showEndpointSecret(done.secret);
    await reloadWebhooks();
  }
});

function showDeliveries(endpoint) {
  const path = "/webhooks/" + endpoint.endpoint_id + "/deliveries?limit=50";
  return showRecent("deliveries", "Deliveries to " + endpoint.url, path, "delivery-row", (row, d) => {
    cell(row, d.type);
    cell(row, "").append(el("span", d.state, d.state === "delivered" ? "badge" : "badge off"));
    cell(row, String(d.attempts), "num");
    cell(row, when(d.next_attempt_at));
    cell(row, d.last_status ? "HTTP " + d.last_status : d.last_error || "—");
    cell(row, when(d.created_at));
    const actions = cell(row, "", "actions");
    const again = button("Redeliver", "secondary small", "redeliver");
    again.dataset.op = "post /webhooks/{endpoint_id}/deliveries/{delivery_id}/redeliver";
    again.addEventListener("click", async () => {
      const url = "/webhooks/" + endpoint.endpoint_id + "/deliveries/" + encodeURIComponent(d.delivery_id) + "/redeliver";
      if (await act($("#deliveries-box"), again, () => api("POST", url))) setTimeout(() => showDeliveries(endpoint), 600);
    });
    actions.append(again);
  });
}

