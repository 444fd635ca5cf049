// API keys: the list, creating (the secret shown once), reveal, edit (expiry, allowlists, budget), roll, revoke.
import { $, $$, FEATURES, button, cell, confirmAction, copy, el, labelCells, number, rowError, when } from "./dom.js";
import { ApiFailure, act, api, clearError, listGeneration, showError, state } from "./api.js";
import { loadAccount } from "./account.js";

const keysList = listGeneration(); // the view's slow first list must not hide a key made (or show one revoked) since

export async function loadKeys() {
  clearError($("#key-form"));
  const list = keysList.restart();
  await act($("#key-form"), null, async () => {
    const keys = await api("GET", "/keys");
    if (!keysList.isCurrent(list)) return;
    state.keys = keys;
    drawKeys();
  });
}

function limitsText(key) {
  const parts = [number.format(key.qps_limit) + " calls/s"];
  if (key.expires_at) parts.push("expires " + when(key.expires_at));
  if (key.allowed_endpoints && key.allowed_endpoints.length) parts.push("endpoints: " + key.allowed_endpoints.join(", "));
  if (key.allowed_ips && key.allowed_ips.length) parts.push("addresses: " + key.allowed_ips.join(", "));
  if (key.credit_limit !== undefined && key.credit_limit !== null) {
    parts.push("budget " + number.format(key.credit_limit) + " credits" +
      (key.credit_limit_period ? " per " + key.credit_limit_period : ""));
  }
  if (typeof key.credits_used === "number") parts.push(number.format(key.credits_used) + " credits used");
  return parts.join(" · ");
}

// A key's state in words: a rolled key in its grace reads "grace until …", not "active".
export function keyState(key) {
  if (key.revoked) return "revoked";
  const ends = key.expires_at ? new Date(key.expires_at) : null;
  if (ends && ends <= new Date()) return key.rolled_to ? "rolled" : "expired";
  if (key.rolled_to) return "grace until " + when(key.expires_at);
  return "active";
}
function keyLabel(key) {
  return "“" + key.name + "” (" + key.prefix + "…, created " + when(key.created_at) + ")";
}

function drawKeys() {
  const body = $("#keys-table tbody");
  body.textContent = "";
  const showRevoked = $("#show-revoked").checked;
  const revoked = state.keys.filter((k) => k.revoked).length;
  const shown = state.keys.filter((k) => showRevoked || !k.revoked);
  $("#show-revoked-label").textContent = "Show revoked keys (" + revoked + ")";
  $("#show-revoked").closest("label").hidden = revoked === 0;
  $("#keys-empty").hidden = state.keys.length > 0;
  $("#keys-all-revoked").hidden = !(state.keys.length > 0 && shown.length === 0);
  shown.forEach((key) => {
    const row = el("tr", undefined, key.revoked ? "revoked" : "");
    row.dataset.testid = "key-row";
    row.dataset.keyId = key.key_id;
    cell(row, key.name);
    const secret = cell(row, "");
    const code = el("code", key.prefix + "…");
    secret.append(code);
    cell(row, when(key.created_at));
    cell(row, when(key.last_used_at));
    cell(row, limitsText(key), "limits");
    const stateCell = cell(row, "");
    const word = keyState(key);
    stateCell.append(el("span", word, word === "active" ? "badge" : word.startsWith("grace") ? "badge grace" : "badge off"));
    const actions = cell(row, "", "actions");
    if (!key.revoked) {
      // A revoked key's secret is never shown again (GET /keys/{id}/reveal answers 410).
      const reveal = button("Reveal", "secondary small");
      reveal.dataset.op = "get /keys/{key_id}/reveal";
      reveal.setAttribute("aria-label", "Reveal key " + key.name);
      reveal.addEventListener("click", () => toggleReveal(key, code, reveal));
      actions.append(reveal);
      if (FEATURES.has("key-edit")) {
        const edit = button("Edit", "secondary small");
        edit.dataset.op = "patch /keys/{key_id}";
        edit.setAttribute("aria-label", "Edit key " + key.name);
        edit.addEventListener("click", () => editKey(key));
        actions.append(edit);
      }
      if (FEATURES.has("key-roll") && !key.rolled_to) { // a rolled key is rolled once (409 otherwise)
        const roll = button("Roll", "secondary small");
        roll.dataset.op = "post /keys/{key_id}/roll";
        roll.setAttribute("aria-label", "Roll key " + key.name);
        roll.addEventListener("click", () => rollKey(key, roll));
        actions.append(roll);
      }
      const revoke = button("Revoke", "danger small", "revoke-key");
      revoke.dataset.op = "post /keys/{key_id}/revoke";
      revoke.setAttribute("aria-label", "Revoke key " + key.name);
      revoke.addEventListener("click", () => revokeKey(key, revoke));
      actions.append(revoke);
    }
    actions.append(rowError()); // a failed action is reported in its own row
    body.append(row);
  });
  labelCells($("#keys-table"));
}

async function toggleReveal(key, code, trigger) {
  if (code.dataset.shown) {
    code.textContent = key.prefix + "…";
    delete code.dataset.shown;
    trigger.textContent = "Reveal";
    return;
  }
  const shown = await act(trigger.parentNode, trigger, () => api("GET", "/keys/" + key.key_id + "/reveal"));
  if (shown) {
    code.textContent = shown.key;
    code.dataset.shown = "1";
    trigger.textContent = "Hide";
  }
}

async function revokeKey(key, trigger) {
  const sure = await confirmAction(
    "Revoke " + key.name + "?",
    "Key " + keyLabel(key) + ": calls with it will be refused at once, and its secret is never shown again. " +
      "This cannot be undone.",
    "Revoke key",
  );
  if (!sure) return;
  const done = await act(trigger.parentNode, trigger, () => api("POST", "/keys/" + key.key_id + "/revoke"));
  if (!done) return;
  if ($("#key-secret").textContent.startsWith(key.prefix)) {
    // The secret on show belongs to the key just revoked: it must not look usable any longer.
    hideSecret();
  }
  await loadKeys();
}

async function rollKey(key, trigger) {
  $("#roll-grace-box").hidden = false;
  const sure = await confirmAction(
    "Roll " + key.name + "?",
    "Key " + keyLabel(key) + ": a new secret with the same properties replaces it; the old secret stops working " +
      "after the grace period.",
    "Roll key",
  );
  $("#roll-grace-box").hidden = true;
  if (!sure) return;
  const body = { grace_seconds: Number($("#roll-grace").value) };
  const rolled = await act(trigger.parentNode, trigger, () => api("POST", "/keys/" + key.key_id + "/roll", body));
  if (rolled) {
    showSecret(rolled.key);
    await loadKeys();
  }
}

function showSecret(secret) {
  $("#key-secret").textContent = secret;
  $("#copy-status").textContent = "";
  $("#new-secret").hidden = false;
}
export function hideSecret() {
  $("#new-secret").hidden = true;
  $("#key-secret").textContent = "";
}

$("#key-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const name = $("#key-name").value.trim();
  const created = await act($("#key-form"), $("#create-key"), () => api("POST", "/keys", name ? { name } : {}));
  if (created) {
    $("#key-name").value = "";
    showSecret(created.key);
    await loadKeys();
    loadAccount(null);
  }
});

$("#copy-secret").addEventListener("click", () => copy($("#key-secret").textContent, $("#copy-status")));
$("#show-revoked").addEventListener("change", drawKeys);

// Key properties (expiry, endpoint and address allowlists, budget): shown for the properties the API returns.
const keyDialog = $("#key-dialog");
let editing = null;
function listText(value) {
  return Array.isArray(value) ? value.join(", ") : "";
}
function editKey(key) {
  editing = key;
  const form = $("#key-edit-form");
  clearError(form);
  $("#edit-name").value = key.name;
  $$("[data-prop]", form).forEach((box) => (box.hidden = !(box.dataset.prop in key)));
  $("#edit-expires").value = key.expires_at ? new Date(key.expires_at).toISOString().slice(0, 16).replace("T", " ") : "";
  $("#edit-endpoints").value = listText(key.allowed_endpoints);
  $("#edit-ips").value = listText(key.allowed_ips);
  $("#edit-limit").value = key.credit_limit === null || key.credit_limit === undefined ? "" : key.credit_limit;
  $("#edit-period").value = key.credit_limit_period || "month";
  keyDialog.showModal();
}
$("#key-edit-cancel").addEventListener("click", () => keyDialog.close());
$("#key-edit-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = $("#key-edit-form");
  const split = (text) => text.split(",").map((s) => s.trim()).filter(Boolean);
  const same = (a, b) => JSON.stringify(a === undefined ? null : a) === JSON.stringify(b === undefined ? null : b);
  // What the form says, in the API's terms (null: no restriction)...
  const wanted = { name: $("#edit-name").value.trim() };
  // Read as typed, in UTC ("2030-01-31 12:00", a "T" also accepted): no locale-dependent date picker.
  const expires = $("#edit-expires").value.trim();
  const typed = /^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2})$/.exec(expires);
  if (expires && (!typed || isNaN(new Date(typed[1] + "T" + typed[2] + "Z")))) {
    clearError(form);
    showError(form, new ApiFailure(422, "Expires: write it as 2030-01-31 12:00 (UTC)", ["expires_at"],
      { expires_at: ["Write it as 2030-01-31 12:00 (UTC)"] }));
    return;
  }
  wanted.expires_at = typed ? new Date(typed[1] + "T" + typed[2] + "Z").toISOString() : null;
  const endpoints = split($("#edit-endpoints").value);
  wanted.allowed_endpoints = endpoints.length ? endpoints : null;
  const ips = split($("#edit-ips").value);
  wanted.allowed_ips = ips.length ? ips : null;
  const limit = $("#edit-limit").value;
  wanted.credit_limit = limit === "" ? null : Number(limit);
  wanted.credit_limit_period = limit === "" ? null : $("#edit-period").value;
  // ...and only what changed is sent: an untouched expiry of an expired key must not be rewritten.
  const body = {};
  Object.entries(wanted).forEach(([name, value]) => {
    if (!(name in editing)) return;
    const before = name === "expires_at" && editing.expires_at ? new Date(editing.expires_at).toISOString().slice(0, 16) : editing[name];
    const now = name === "expires_at" && value ? value.slice(0, 16) : value;
    if (!same(before, now)) body[name] = value;
  });
  if ("credit_limit" in body || "credit_limit_period" in body) {
    body.credit_limit = wanted.credit_limit;
    body.credit_limit_period = wanted.credit_limit_period;
  }
  if (!Object.keys(body).length) {
    keyDialog.close();
    return;
  }
  const saved = await act(form, $("#key-edit-save"), () => api("PATCH", "/keys/" + editing.key_id, body));
  if (saved) {
    keyDialog.close();
    await loadKeys();
  }
});
