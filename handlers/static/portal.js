// The portal's only script: draws every view from the gateway's JSON API. No framework, no build step.
// The session is an HttpOnly cookie this script cannot read; writes carry the XSRF token from the page.
"use strict";

(function () {
  const $ = (selector, root) => (root || document).querySelector(selector);
  const $$ = (selector, root) => Array.from((root || document).querySelectorAll(selector));
  const XSRF = $('meta[name="xsrf-token"]').content;
  const FEATURES = new Set((document.body.dataset.features || "").split(" ").filter(Boolean));
  const FINAL = new Set(["finished", "failed", "refunded", "expired"]);
  const VIEWS = ["overview", "keys", "usage", "billing", "alerts", "streams", "admin"];
  const FIELD_LABELS = {
    email: "Email", password: "Password", name: "Name", amount_usd: "Amount (USD)", currency: "Currency",
    current_password: "Current password", new_password: "New password", body: "Request",
    expires_at: "Expires", allowed_endpoints: "Allowed endpoints", allowed_ips: "Allowed addresses",
    credit_limit: "Credit budget", credit_limit_period: "Budget period", grace_seconds: "Grace period",
    tag: "Tag", value: "Search", x_user_name: "Account", interval_seconds: "Interval", active: "Active",
    url: "URL", kind: "Rule", credits: "Amount", usd: "Amount", percent: "Amount", levels: "Levels",
  };
  const WHERE = new Set(["body", "query", "path", "header"]);
  const state = { me: null, account: null, keys: [], order: null, orderTimer: null, usersCursor: "", passwordChange: null };

  // --- the API -------------------------------------------------------------------------------
  class ApiFailure extends Error {
    constructor(status, message, fields, byField) {
      super(message);
      this.status = status;
      this.fields = fields || [];
      this.byField = byField || {}; // field name -> its messages, shown next to the field where a form has a slot
    }
  }

  let pending = 0;
  function busy(delta) {
    pending += delta;
    $("#busy").hidden = pending === 0;
  }

  // The API's validation words (pydantic's: "String should have at least 8 characters") in a person's.
  const PLAIN = [
    [/^(String should have at least 1 characters?|Field required)$/, () => "this field is required"],
    [/^String should have at (least|most) (\d+) characters$/, (m) => "use at " + m[1] + " " + m[2] + " characters"],
    [/^List should have at (least|most) (\d+) items?(.*)$/, (m) => "give at " + m[1] + " " + m[2] + " items" + m[3]],
    [/^Input should be greater than or equal to (\S+)(.*)$/, (m) => "use " + bare(m[1]) + " or more" + m[2]],
    [/^Input should be less than or equal to (\S+)(.*)$/, (m) => "use " + bare(m[1]) + " or less" + m[2]],
    [/^Input should be greater than (\S+)(.*)$/, (m) => "use more than " + bare(m[1]) + m[2]],
    [/^Input should be a valid (number|integer|float)\b.*$/, () => "write a number"],
    [/^(?:Input|String|List|Cursor) should (.*)$/, (m) => "must " + m[1]],
  ];
  const bare = (n) => n.replace(/\.0+$/, ""); // 10.0 -> 10
  function plain(msg) {
    for (const [pattern, say] of PLAIN) {
      const m = pattern.exec(msg);
      if (m) return say(m);
    }
    return msg;
  }

  function readable(status, body) {
    // 422: {"detail": [{loc, msg, type}]}; other portal errors: {"detail": "..."}; data plane: {"msg": "..."}.
    if (body && Array.isArray(body.detail)) {
      // loc is ["body", field] or, for a list item, ["body", field, index]: name the field as its form does.
      const fields = body.detail.map((e) => String(e.loc.find((part) => typeof part === "string" && !WHERE.has(part)) || ""));
      const byField = {};
      const text = body.detail
        .map((e, i) => {
          const index = e.loc.find((part) => typeof part === "number");
          const name = FIELD_LABELS[fields[i]] || fields[i] || "Input";
          const msg = plain(e.msg);
          if (fields[i]) (byField[fields[i]] = byField[fields[i]] || []).push((index === undefined ? "" : "Item " + (index + 1) + ": ") + msg);
          return name + (index === undefined ? "" : " (item " + (index + 1) + ")") + ": " + msg;
        })
        .join("; ");
      return [text, fields.filter(Boolean), byField];
    }
    if (body && typeof body.detail === "string") return [body.detail, []];
    if (body && typeof body.msg === "string") return [body.msg, []];
    if (status === 0) return ["The gateway cannot be reached; check your connection and try again.", []];
    return ["The request failed (HTTP " + status + ").", []];
  }

  async function api(method, path, body, headers) {
    const init = { method, credentials: "same-origin", headers: Object.assign({ Accept: "application/json" }, headers) };
    if (method !== "GET") {
      init.headers["X-XSRFToken"] = XSRF;
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body === undefined ? {} : body);
    }
    busy(1);
    let response;
    try {
      response = await fetch(path, init);
    } catch (err) {
      throw new ApiFailure(0, readable(0, null)[0]);
    } finally {
      busy(-1);
    }
    let data = null;
    try {
      data = await response.json();
    } catch (err) {
      data = null;
    }
    if (!response.ok) {
      const [message, fields, byField] = readable(response.status, data);
      if (response.status === 401 && state.me && !path.startsWith("/portal/")) {
        signedOut("Your session has ended; log in again.");
      }
      throw new ApiFailure(response.status, message, fields, byField);
    }
    return data;
  }

  // --- errors and progress next to what caused them ----------------------------------------------
  function errorBox(scope) {
    return $('[data-testid="error"]', scope);
  }
  function clearError(scope) {
    const box = errorBox(scope);
    box.hidden = true;
    box.textContent = "";
    $$('[aria-invalid="true"]', scope).forEach((el) => el.removeAttribute("aria-invalid"));
    $$("[data-error-for]", scope).forEach((slot) => {
      slot.hidden = true;
      slot.textContent = "";
    });
  }
  function showError(scope, err) {
    const box = errorBox(scope);
    box.textContent = err instanceof ApiFailure ? err.message : "Something went wrong in this page: " + err;
    box.hidden = false;
    // A form with a slot per field shows each field's error under it; the shared box keeps only the rest.
    const slotted = Object.keys(err.byField || {}).filter((name) => $('[data-error-for="' + name + '"]', scope));
    slotted.forEach((name) => {
      const slot = $('[data-error-for="' + name + '"]', scope);
      slot.textContent = err.byField[name].join("; ");
      slot.hidden = false;
    });
    if (slotted.length && slotted.length === Object.keys(err.byField).length && !(err.fields || []).includes("")) {
      box.hidden = true;
    }
    (err.fields || []).forEach((name) => {
      const input = $('[name="' + name + '"]', scope);
      if (input) input.setAttribute("aria-invalid", "true");
    });
    if (!(err instanceof ApiFailure)) console.warn(err);
  }
  // Runs `work` with `button` busy and the scope's error box cleared first, filled on failure.
  async function act(scope, button, work) {
    clearError(scope);
    if (button) {
      button.disabled = true;
      button.setAttribute("aria-busy", "true");
    }
    try {
      return await work();
    } catch (err) {
      showError(scope, err);
      return undefined;
    } finally {
      if (button) {
        button.disabled = false;
        button.removeAttribute("aria-busy");
      }
    }
  }

  // --- formatting ------------------------------------------------------------------------------
  const number = new Intl.NumberFormat("en-US");
  const usd = new Intl.NumberFormat("en-US", { style: "currency", currency: "USD" });
  function when(iso) {
    if (!iso) return "—";
    const d = new Date(iso);
    return isNaN(d) ? String(iso) : d.toISOString().slice(0, 16).replace("T", " ") + " UTC"; // one format everywhere
  }
  function cell(row, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    row.append(td);
    return td;
  }
  // Each cell names its column, shown beside the value where a phone screen stacks the table (portal.css).
  function labelCells(table) {
    const names = Array.from(table.tHead.rows[0].cells).map((th) => th.textContent);
    Array.from(table.tBodies[0].rows).forEach((row) =>
      Array.from(row.cells).forEach((td, i) => (td.dataset.label = names[i] || "")));
  }
  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined) node.textContent = text;
    if (cls) node.className = cls;
    return node;
  }
  function button(text, cls, testid) {
    const b = el("button", text, cls);
    b.type = "button";
    if (testid) b.dataset.testid = testid;
    return b;
  }

  // --- confirmation ----------------------------------------------------------------------------
  function confirmAction(title, text, okLabel) {
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

  // --- views -----------------------------------------------------------------------------------
  function currentView() {
    const name = location.hash.slice(1);
    if (name === "admin" && !(state.me && state.me.is_admin)) return "overview";
    return VIEWS.includes(name) ? name : "overview";
  }
  function route() {
    if (!state.me) return;
    const name = currentView();
    VIEWS.forEach((v) => ($("#view-" + v).hidden = v !== name));
    $$("#nav a[data-view]").forEach((a) => {
      if (a.dataset.view === name) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    });
    LOADERS[name]();
  }
  const LOADERS = {
    overview: () => loadAccount($("#view-overview")),
    keys: loadKeys,
    usage: loadUsage,
    billing: loadBilling,
    alerts: loadAlerts,
    streams: () => loadStreams(),
    admin: loadAdmin,
  };

  // --- sign in and out -------------------------------------------------------------------------
  async function start() {
    FEATURES.forEach((f) => $$('[data-feature="' + f + '"]').forEach((n) => (n.hidden = false)));
    if (document.body.dataset.signedIn === "yes") {
      try {
        signedIn(await api("GET", "/auth/me"));
        return;
      } catch (err) {
        signedOut(err.status === 401 ? "Your session has ended; log in again." : err.message);
        return;
      }
    }
    signedOut("");
    showResetForm();
  }

  function signedIn(me) {
    state.me = me;
    exampleCall("USER_NAME");
    if (FEATURES.has("sandbox")) {
      // A user the development sandbox knows, so that the example answers with data.
      api("GET", "/sandbox/catalog").then((c) => c.users && c.users[0] && exampleCall(c.users[0].userName), () => {});
    }
    $("#who-email").textContent = me.email;
    $("#view-auth").hidden = true;
    $("#nav").hidden = false;
    $("#who").hidden = false;
    $('#nav a[data-view="admin"]').hidden = !me.is_admin;
    route();
    $("#main").focus();
    if (currentView() !== "overview") loadAccount(null); // the balance warning shows on every view
  }

  function exampleCall(userName) {
    $("#example-call").textContent =
      'curl -H "X-API-Key: YOUR_KEY" "' + location.origin + "/social/user/info?userName=" + encodeURIComponent(userName) + '"';
  }

  function signedOut(message) {
    state.me = state.account = null;
    stopOrderPolling();
    VIEWS.forEach((v) => ($("#view-" + v).hidden = true));
    $("#nav").hidden = true;
    $("#who").hidden = true;
    $("#balance-warning").hidden = true;
    $("#new-secret").hidden = true;
    $("#key-secret").textContent = "";
    $("#view-auth").hidden = false;
    const scope = $("#auth-form");
    clearError(scope);
    if (message) showError(scope, new ApiFailure(401, message));
  }

  async function authenticate(path, trigger) {
    const scope = $("#auth-form");
    const body = { email: $("#email").value.trim(), password: $("#password").value };
    const done = await act(scope, trigger, async () => {
      const answer = await api("POST", path, body);
      if (answer && answer.two_factor_required) return answer; // the second step: askSecondFactor, below
      return api("GET", "/auth/me");
    });
    if (done) {
      $("#password").value = "";
      if (done.two_factor_required) askSecondFactor(done.challenge);
      else signedIn(done);
    }
  }

  $("#auth-form").addEventListener("submit", (event) => {
    event.preventDefault();
    authenticate("/portal/login", $("#login"));
  });
  $("#register").addEventListener("click", () => authenticate("/portal/register", $("#register")));
  $("#logout").addEventListener("click", async () => {
    // A password change in flight answers with a new session cookie: let it land first, then end that session.
    if (state.passwordChange) await state.passwordChange;
    try {
      await api("POST", "/portal/logout");
    } catch (err) {
      console.warn("logout", err.message);
    }
    location.hash = "";
    signedOut("");
    authPanel("#auth-form", "You are signed out. Sign in again below, or close this tab.");
  });

  // --- account ---------------------------------------------------------------------------------
  async function loadAccount(scope) {
    let account;
    try {
      account = await api("GET", "/account");
    } catch (err) {
      if (scope) showError(scope, err);
      return null;
    }
    state.account = account;
    const worth = account.credits / account.credits_per_usd;
    $("#balance").textContent = number.format(account.credits) + " credits";
    $("#balance-usd").textContent = "worth " + usd.format(worth);
    $("#billing-balance").textContent = number.format(account.credits) + " credits";
    $("#plan").textContent = account.plan;
    $("#qps").textContent = "up to " + number.format(account.qps_limit) + " calls per second per key";
    $("#paid").textContent = usd.format(account.total_paid_usd);
    const warning = $("#balance-warning");
    warning.textContent = "";
    warning.className = "warning";
    if (account.credits <= 0) {
      warning.classList.add("zero");
      warning.append("Your balance is zero: data calls are refused (HTTP 402) until you buy credits. ");
    } else if (worth < 1) {
      warning.append("Your balance is low (" + number.format(account.credits) + " credits, under 1 USD): " +
        "data calls will be refused (HTTP 402) when it runs out. ");
    }
    if (warning.childNodes.length) {
      const link = el("a", "Buy credits now");
      link.href = "#billing";
      warning.append(link, ".");
    }
    warning.hidden = !warning.childNodes.length;
    return account;
  }

  const passwordForm = $("#password-form");
  passwordForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    const ok = $(".ok", passwordForm);
    ok.hidden = true;
    const body = { current_password: $("#current-password").value, new_password: $("#new-password").value };
    state.passwordChange = act(passwordForm, $('button[type="submit"]', passwordForm), () =>
      api("POST", "/portal/password", body));
    const done = await state.passwordChange;
    state.passwordChange = null;
    if (done !== undefined) {
      passwordForm.reset();
      ok.textContent = "Password changed.";
      ok.hidden = false;
    }
  });

  // --- keys ------------------------------------------------------------------------------------

  async function loadKeys() {
    clearError($("#key-form"));
    await act($("#key-form"), null, async () => {
      state.keys = await api("GET", "/keys");
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
  function keyState(key) {
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
        reveal.setAttribute("aria-label", "Reveal key " + key.name);
        reveal.addEventListener("click", () => toggleReveal(key, code, reveal));
        actions.append(reveal);
        if (FEATURES.has("key-edit")) {
          const edit = button("Edit", "secondary small");
          edit.setAttribute("aria-label", "Edit key " + key.name);
          edit.addEventListener("click", () => editKey(key));
          actions.append(edit);
        }
        if (FEATURES.has("key-roll") && !key.rolled_to) { // a rolled key is rolled once (409 otherwise)
          const roll = button("Roll", "secondary small");
          roll.setAttribute("aria-label", "Roll key " + key.name);
          roll.addEventListener("click", () => rollKey(key, roll));
          actions.append(roll);
        }
        const revoke = button("Revoke", "danger small", "revoke-key");
        revoke.setAttribute("aria-label", "Revoke key " + key.name);
        revoke.addEventListener("click", () => revokeKey(key, revoke));
        actions.append(revoke);
      }
      const failed = el("p", "", "error");  // a failed action is reported in its own row
      failed.dataset.testid = "error";
      failed.setAttribute("role", "alert");
      failed.hidden = true;
      actions.append(failed);
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
      $("#new-secret").hidden = true;
      $("#key-secret").textContent = "";
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

  async function copy(text, status) {
    try {
      await navigator.clipboard.writeText(text);
      status.textContent = "Copied.";
    } catch (err) {
      status.textContent = "Select the text and copy it by hand.";
    }
  }
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

  // --- usage -----------------------------------------------------------------------------------
  const usageView = $("#view-usage");
  let csvUrl = null;

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

  async function loadUsage() {
    const days = selectedDays();
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
        state.keys = keys;
        byDay.forEach((r) => perDay.has(r.day) && perDay.set(r.day, { calls: r.calls, credits: r.credits }));
        byEndpoint.forEach((r) => perEndpoint.set(r.endpoint, r));
        drawChart($("#usage-chart"), $("#usage-totals"), perDay, days);
        drawEndpoints(perEndpoint);
        drawKeyUsage(byKey);
        logFilters(perEndpoint);
        await loadLog(true);
        offerCsv([], days);
        return;
      }
      const records = await api("GET", "/usage?days=" + days + "&limit=10000");
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

  const SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    Object.entries(attrs || {}).forEach(([k, v]) => node.setAttribute(k, v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // A chart is drawn again when its box changes width (a phone turned, a window narrowed, a view drawn while
  // hidden): the picture is scaled to its box, and its axis text with it, to a few pixels on a phone.
  const chartBoxes = new ResizeObserver((changed) => changed.forEach(({ target }) => {
    const drawn = target.drawnChart;
    if (drawn && target.clientWidth && target.clientWidth !== drawn.width) drawChart(target, ...drawn.args);
  }));

  function drawChart(box, totalsLine, perDay, days) {
    box.textContent = "";
    box.drawnChart = { width: box.clientWidth, args: [totalsLine, perDay, days] };
    chartBoxes.observe(box);
    const entries = Array.from(perDay.entries());
    // Drawn at the box's own width (within 320..720) so the axis text stays legible on a phone.
    const W = Math.round(Math.min(720, Math.max(320, box.clientWidth || 720)));
    const H = 240, left = 44, right = 52, top = 12, bottom = 28;
    const plotW = W - left - right, plotH = H - top - bottom;
    const maxCalls = Math.max(1, ...entries.map(([, v]) => v.calls));
    const maxCredits = Math.max(1, ...entries.map(([, v]) => v.credits));
    const totalCalls = entries.reduce((s, [, v]) => s + v.calls, 0);
    const totalCredits = entries.reduce((s, [, v]) => s + v.credits, 0);
    const chart = svg("svg", {
      viewBox: "0 0 " + W + " " + H,
      role: "img",
      "aria-label": "Calls (bars) and credits (line) per day over the last " + days + " days: " +
        totalCalls + " calls, " + totalCredits + " credits in all.",
    });
    chart.append(svg("line", { x1: left, y1: top + plotH, x2: left + plotW, y2: top + plotH, class: "axis" }));
    chart.append(svg("text", { x: left - 6, y: top + 10, "text-anchor": "end" }, number.format(maxCalls)));
    chart.append(svg("text", { x: left - 6, y: top + plotH, "text-anchor": "end" }, "0"));
    chart.append(svg("text", { x: left + plotW + 6, y: top + 10 }, number.format(maxCredits)));
    const step = plotW / entries.length;
    const points = [];
    const labelEvery = Math.ceil(entries.length / Math.max(3, Math.min(8, Math.floor(plotW / 52))));
    entries.forEach(([date, v], i) => {
      const h = (v.calls / maxCalls) * plotH;
      const bar = svg("rect", {
        x: (left + i * step + step * 0.15).toFixed(1),
        y: (top + plotH - h).toFixed(1),
        width: Math.max(1, step * 0.7).toFixed(1),
        height: h.toFixed(1),
        class: "bar",
      });
      bar.append(svg("title", {}, date + ": " + v.calls + " calls, " + v.credits + " credits"));
      chart.append(bar);
      const cx = left + i * step + step / 2;
      const cy = top + plotH - (v.credits / maxCredits) * plotH;
      points.push(cx.toFixed(1) + "," + cy.toFixed(1));
      if (entries.length <= 31) chart.append(svg("circle", { cx: cx.toFixed(1), cy: cy.toFixed(1), r: 2.5, class: "dot" }));
      const last = i === entries.length - 1 && i % labelEvery >= labelEvery / 2;
      if (i % labelEvery === 0 || last) {
        chart.append(svg("text", { x: cx.toFixed(1), y: H - 8, "text-anchor": "middle" }, date.slice(5)));
      }
    });
    chart.append(svg("polyline", { points: points.join(" "), class: "line" }));
    box.append(chart);
    totalsLine.textContent = number.format(totalCalls) + " calls and " + number.format(totalCredits) +
      " credits in the last " + days + " days (UTC).";
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

  // --- the request log: GET /usage/log, filtered, newest first, a page at a time ---------------------
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
    if (reset) state.logCursor = "";
    const days = selectedDays();
    const query = new URLSearchParams({ limit: "50" });
    const requestId = $("#log-request").value.trim();
    // A request id is looked for in the whole history; the other filters within the period chosen above.
    query.set("since", requestId ? "1970-01-01T00:00:00+00:00" : new Date(Date.now() - days * 86400000).toISOString());
    [["key_id", "#log-key"], ["endpoint", "#log-endpoint"], ["status", "#log-status"]].forEach(([name, sel]) => {
      if ($(sel).value) query.set(name, $(sel).value);
    });
    if (requestId) query.set("request_id", requestId);
    if (state.logCursor) query.set("cursor", state.logCursor);
    const page = await api("GET", "/usage/log?" + query.toString());
    drawCalls(page.records, !reset);
    state.logCursor = page.next_cursor;
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
      cell(row, r.endpoint, "path");
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

  // --- buying credits ----------------------------------------------------------------------------
  const checkoutForm = $("#checkout-form");
  const orderBox = $("#order");
  let currencies = [];

  async function loadBilling() {
    loadAccount(null);
    await act(checkoutForm, null, async () => {
      if (!currencies.length) {
        const config = await api("GET", "/billing/crypto/config");
        currencies = config.currencies;
        $("#price-line").textContent = "1 USD buys " + number.format(config.credits_per_usd) + " credits.";
        const select = $("#checkout-currency");
        select.textContent = "";
        currencies.forEach((c) => {
          // Short enough to show whole in the picker on a phone: the name says the network, the hint the code.
          const option = el("option", c.name + " — from " + usd.format(c.min_usd));
          option.value = c.code;
          select.append(option);
        });
        if (!currencies.length) throw new ApiFailure(503, "Crypto payments are not configured on this server.");
        minimumChanged();
      }
      await loadOrders();
    });
  }

  function minimumChanged() {
    const c = currencies.find((x) => x.code === $("#checkout-currency").value);
    if (!c) return;
    const amount = $("#checkout-amount");
    amount.min = c.min_usd;
    if (!amount.value || Number(amount.value) < c.min_usd) amount.value = Math.max(c.min_usd, 10);
    $("#checkout-min").textContent = "Minimum in " + c.code + ": " + usd.format(c.min_usd);
  }
  $("#checkout-currency").addEventListener("change", minimumChanged);

  checkoutForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    const raw = $("#checkout-amount").value;
    const body = { currency: $("#checkout-currency").value, amount_usd: raw === "" ? null : Number(raw) };
    const order = await act(checkoutForm, $("#checkout-submit"), () => api("POST", "/billing/crypto/checkout", body));
    if (order) {
      showOrder(order);
      loadOrders();
    }
  });

  function showOrder(order) {
    const before = state.order;
    state.order = order;
    orderBox.hidden = false;
    if (!before || before.order_id !== order.order_id) {
      clearError(orderBox);
      $("#order-qr").src = "/billing/crypto/orders/" + encodeURIComponent(order.order_id) + "/qr";
    }
    $("#order-id").textContent = order.order_id;
    const status = $("#order-status");
    status.textContent = order.status.replace("_", " ");
    status.className = "status " + order.status;
    $("#order-amount").textContent = order.pay_amount + " " + order.pay_currency;
    $("#order-address").textContent = order.pay_address;
    $("#order-price").textContent = usd.format(order.price_usd) + " = " + number.format(order.credits_expected) + " credits";
    $("#order-received").textContent = order.amount_received.amount + " " + order.pay_currency +
      " (" + order.amount_confirmed.amount + " confirmed)";
    $("#order-credits").textContent = number.format(order.credits_applied) + " applied";
    $("#order-expiry").textContent = when(order.expires_at);
    const open = !FINAL.has(order.status);
    // A closed order has nothing left to pay: no QR code, no deadline.
    $("#order-qr").hidden = !open;
    $$(".open-only", orderBox).forEach((n) => (n.hidden = !open));
    $("#order-note").textContent = open
      ? "Waiting for the payment; this status updates on its own."
      : order.status === "finished" ? "Paid: the credits are on your balance." : "This order is closed.";
    $("#sandbox-pay").disabled = !open;
    // Confirming needs a payment to confirm: enabled once some of it arrived unconfirmed.
    const unconfirmed = Number(order.amount_received.amount) > Number(order.amount_confirmed.amount);
    const confirm = $("#sandbox-confirm");
    confirm.disabled = !(open && unconfirmed);
    confirm.title = confirm.disabled ? "Simulate a payment first: then the network can confirm it" : "";
    if (before && before.order_id === order.order_id && before.credits_applied !== order.credits_applied) {
      loadAccount(null);
    }
    if (before && before.order_id === order.order_id && before.status !== order.status) {
      loadOrders().catch((err) => showError(orderBox, err));
    }
    if (open) pollOrder();
    else {
      stopOrderPolling();
      loadAccount(null);
    }
  }

  function stopOrderPolling() {
    clearTimeout(state.orderTimer);
    state.orderTimer = null;
  }
  function pollOrder() {
    stopOrderPolling();
    const id = state.order.order_id;
    state.orderTimer = setTimeout(async () => {
      if (!state.me || !state.order || state.order.order_id !== id) return;
      try {
        showOrder(await api("GET", "/billing/crypto/orders/" + encodeURIComponent(id)));
      } catch (err) {
        showError(orderBox, err);
        if (err.status !== 401) pollOrder();
      }
    }, 2000);
  }

  async function loadOrders() {
    const orders = await api("GET", "/billing/crypto/orders?limit=20");
    const body = $("#orders-table tbody");
    body.textContent = "";
    $("#orders-empty").hidden = orders.length > 0;
    $("#orders-table").hidden = orders.length === 0;
    orders.forEach((o) => {
      const row = el("tr");
      const first = cell(row, "", "path");
      const open = button(o.order_id, "link");
      open.addEventListener("click", () => {
        showOrder(o);
        orderBox.scrollIntoView();
      });
      first.append(open);
      cell(row, when(o.created_at));
      cell(row, usd.format(o.price_usd), "num");
      cell(row, o.pay_currency);
      cell(row, o.status.replace("_", " "));
      cell(row, number.format(o.credits_applied), "num");
      body.append(row);
    });
    labelCells($("#orders-table"));
  }

  $("#copy-address").addEventListener("click", () => copy($("#order-address").textContent, $("#order-note")));
  $("#sandbox-pay").addEventListener("click", async () => {
    const order = state.order;
    const paid = await act(orderBox, $("#sandbox-pay"), () =>
      api("POST", "/billing/crypto/sandbox/pay", { order_id: order.order_id, amount_usd: order.price_usd, confirmed: false }));
    if (paid) showOrder(paid.order);
  });
  $("#sandbox-confirm").addEventListener("click", async () => {
    const done = await act(orderBox, $("#sandbox-confirm"), () =>
      api("POST", "/billing/crypto/sandbox/confirm", { order_id: state.order.order_id }));
    if (done) showOrder(done.order);
  });

  // --- admin -----------------------------------------------------------------------------------
  const adminView = $("#view-admin");
  async function loadAdmin() {
    state.usersCursor = "";
    $("#users-table tbody").textContent = "";
    await act(adminView, null, async () => {
      const internal = $("#include-internal").checked ? "&include_internal=true" : "";
      const metrics = await api("GET", "/admin/metrics?days=30" + internal);
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
      await moreUsers();
    });
  }
  async function moreUsers() {
    const internal = $("#include-internal").checked ? "&include_internal=true" : "";
    const q = $("#users-q").value.trim();
    const query = "/admin/users?limit=50" + internal + (q ? "&q=" + encodeURIComponent(q) : "") +
      (state.usersCursor ? "&cursor=" + encodeURIComponent(state.usersCursor) : "");
    const page = await api("GET", query);
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
    state.usersCursor = page.next_cursor;
    $("#users-more").hidden = !page.has_next_page;
  }
  $("#users-more").addEventListener("click", () => act(adminView, $("#users-more"), moreUsers));
  $("#include-internal").addEventListener("change", loadAdmin);

  // --- the admin console: search, one account, credit or debit, suspend ------------------------------
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
    state.usersCursor = "";
    $("#users-table tbody").textContent = "";
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
    const a = await act(detailBox, null, () => api("GET", "/admin/accounts/" + encodeURIComponent(accountId)));
    if (!a) return;
    state.detail = a;
    // One Idempotency-Key per intended change: a double click or a retry applies it once.
    state.adjustKey = crypto.randomUUID ? crypto.randomUUID() : Date.now() + "-" + Math.random().toString(36).slice(2);
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
    const url = "/admin/accounts/" + encodeURIComponent(state.detail.account_id) + "/" + kind;
    const headers = { "Idempotency-Key": state.adjustKey + "-" + kind };
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
    const a = state.detail;
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


  // --- alerts and webhooks ---------------------------------------------------------------------
  const ruleForm = $("#rule-form");
  const endpointForm = $("#endpoint-form");
  const alertsView = $("#view-alerts");
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

  async function loadAlerts() {
    clearError(ruleForm);
    ruleFields();
    await act(ruleForm, null, async () => {
      drawRules(await api("GET", "/alerts"));
      drawWebhooks(await api("GET", "/webhooks"));
    });
  }

  // One row per item (drawRow fills it); the table's "none yet" note shows when there is none.
  function fillTable(table, empty, items, testid, drawRow) {
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

  function drawRules(rules) {
    fillTable("#rules-table", "#rules-empty", rules, "rule-row", (row, rule) => {
      cell(row, rule.description);
      cell(row, "").append(el("span", rule.armed ? "armed" : "fired", rule.armed ? "badge" : "badge off"));
      cell(row, when(rule.fired_at));
      const actions = cell(row, "", "actions");
      const remove = button("Delete", "danger small", "delete-rule");
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
      drawRules(await api("GET", "/alerts"));
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
      test.addEventListener("click", async () => {
        if (await act(actions, test, () => api("POST", "/webhooks/" + endpoint.endpoint_id + "/test"))) {
          setTimeout(() => showDeliveries(endpoint), 600);
        }
      });
      const log = button("Deliveries", "secondary small", "show-deliveries");
      log.addEventListener("click", () => showDeliveries(endpoint));
      const roll = button("Roll secret", "secondary small");
      roll.addEventListener("click", async () => {
        const sure = await confirmAction("Roll the signing secret?", "A new secret is shown once; the old one keeps signing for a day.", "Roll");
        const rolled = sure && (await act(actions, roll, () => api("POST", "/webhooks/" + endpoint.endpoint_id + "/roll")));
        if (rolled) showEndpointSecret(rolled.secret);
      });
      actions.append(test, log, roll);
      if (!endpoint.enabled) {
        const enable = button("Enable", "secondary small");
        enable.addEventListener("click", async () => {
          if (await act(actions, enable, () => api("PATCH", "/webhooks/" + endpoint.endpoint_id, { enabled: true }))) loadAlerts();
        });
        actions.append(enable);
      }
      const remove = button("Delete", "danger small");
      remove.addEventListener("click", async () => {
        const sure = await confirmAction("Delete this endpoint?", endpoint.url + " will receive nothing more.", "Delete");
        if (sure && (await act(actions, remove, () => api("DELETE", "/webhooks/" + endpoint.endpoint_id)))) {
          $("#deliveries-box").hidden = true;
          loadAlerts();
        }
      });
      actions.append(remove);
      const failed = el("p", "", "error");
      failed.dataset.testid = "error";
      failed.setAttribute("role", "alert");
      failed.hidden = true;
      actions.append(failed);
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
      drawWebhooks(await api("GET", "/webhooks"));
    }
  });

  async function showDeliveries(endpoint) {
    const box = $("#deliveries-box");
    box.hidden = false;
    $("#deliveries-title").textContent = "Deliveries to " + endpoint.url;
    const rows = await act(box, null, () => api("GET", "/webhooks/" + endpoint.endpoint_id + "/deliveries?limit=50"));
    if (!rows) return;
    fillTable("#deliveries-table", "#deliveries-empty", rows, "delivery-row", (row, d) => {
      cell(row, d.type);
      cell(row, "").append(el("span", d.state, d.state === "delivered" ? "badge" : "badge off"));
      cell(row, String(d.attempts), "num");
      cell(row, when(d.next_attempt_at));
      cell(row, d.last_status ? "HTTP " + d.last_status : d.last_error || "—");
      cell(row, when(d.created_at));
      const actions = cell(row, "", "actions");
      const again = button("Redeliver", "secondary small", "redeliver");
      again.addEventListener("click", async () => {
        const url = "/webhooks/" + endpoint.endpoint_id + "/deliveries/" + encodeURIComponent(d.delivery_id) + "/redeliver";
        if (await act(box, again, () => api("POST", url))) setTimeout(() => showDeliveries(endpoint), 600);
      });
      actions.append(again);
    });
    box.scrollIntoView({ block: "nearest" });
  }

  // --- account security: second factor at login, password reset, 2FA enrolment, the audit log ----------------------
  // (handlers/twofactor.py, handlers/reset.py, handlers/audit.py)
  VIEWS.push("security", "activity");
  const AUTH_PANELS = ["#auth-form", "#second-factor-form", "#forgot-form", "#reset-form"];
  const security = { challenge: null, resetToken: null, auditCursor: null };

  function authPanel(selector, notice) {
    AUTH_PANELS.forEach((s) => ($(s).hidden = s !== selector));
    AUTH_PANELS.forEach((s) => clearError($(s)));
    $("#auth-notice").textContent = notice || "";
    $("#auth-notice").hidden = !notice;
    const first = $("input", $(selector));
    if (first) first.focus();
  }
  $$("#view-auth [data-back]").forEach((b) => b.addEventListener("click", () => {
    security.challenge = security.resetToken = null;
    authPanel("#auth-form");
  }));

  function askSecondFactor(challenge) {
    security.challenge = challenge;
    $("#second-factor-code").value = "";
    authPanel("#second-factor-form");
  }
  $("#second-factor-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = $("#second-factor-form");
    const body = { challenge: security.challenge, code: $("#second-factor-code").value.trim() };
    const me = await act(form, $('button[type="submit"]', form), async () => {
      await api("POST", "/portal/login/2fa", body);
      return api("GET", "/auth/me");
    });
    if (me) {
      security.challenge = null;
      form.hidden = true;
      $("#auth-form").hidden = false;
      signedIn(me);
    }
  });

  $("#forgot-open").addEventListener("click", () => {
    $("#forgot-email").value = $("#email").value.trim();
    $("#forgot-sent").hidden = true;
    authPanel("#forgot-form");
  });
  $("#forgot-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = $("#forgot-form");
    $("#forgot-sent").hidden = true;
    const done = await act(form, $('button[type="submit"]', form), () =>
      api("POST", "/auth/password/forgot", { email: $("#forgot-email").value.trim() }));
    if (done) {
      $("#forgot-sent").textContent = done.detail + ". Check your inbox (and spam folder).";
      $("#forgot-sent").hidden = false;
    }
  });

  // The emailed link is /#reset=<token>: a fragment, so the token never reaches a server log. It is taken out of
  // the address bar at once, and the page opens signed out on the reset form.
  function takeResetToken() {
    if (!location.hash.startsWith("#reset=")) return false;
    security.resetToken = decodeURIComponent(location.hash.slice("#reset=".length));
    history.replaceState(null, "", location.pathname + location.search);
    return true;
  }
  if (takeResetToken()) document.body.dataset.signedIn = "no";
  const showResetForm = () => { if (security.resetToken) authPanel("#reset-form"); };
  window.addEventListener("hashchange", () => {
    // A link opened in a tab already on the portal changes only the fragment: no new page load.
    if (!takeResetToken()) return;
    signedOut("");
    showResetForm();
  });
  $("#reset-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = $("#reset-form");
    const body = { token: security.resetToken, password: $("#reset-password").value };
    const done = await act(form, $('button[type="submit"]', form), () => api("POST", "/auth/password/reset", body));
    if (done) {
      security.resetToken = null;
      form.reset();
      authPanel("#auth-form", "Your password is changed and every session has ended: log in with the new password.");
    }
  });

  // Two-factor enrolment and its state (Security view).
  async function loadSecurity() {
    const card = $("#tfa-card");
    const status = await act(card, null, () => api("GET", "/auth/2fa"));
    if (!status) return;
    $("#tfa-required").hidden = !(status.required && !status.enabled);
    $("#tfa-status").textContent = status.enabled
      ? "On since " + when(status.enrolled_at) + ". " + status.recovery_codes_left + " recovery codes left."
      : "Off: your password alone signs you in.";
    $("#tfa-setup-form").hidden = status.enabled || !$("#tfa-enable-form").hidden;
    $("#tfa-on").hidden = !status.enabled;
  }
  $("#tfa-setup-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = $("#tfa-setup-form");
    const setup = await act(form, $('button[type="submit"]', form), () =>
      api("POST", "/auth/2fa/setup", { password: $("#tfa-setup-password").value }));
    if (!setup) return;
    form.reset();
    form.hidden = true;
    $("#tfa-qr").src = setup.qr_svg;
    $("#tfa-secret").textContent = setup.secret.replace(/(.{4})/g, "$1 ").trim();
    $("#tfa-enable-form").hidden = false;
    $("#tfa-code").focus();
  });
  function showRecoveryCodes(codes) {
    const list = $("#tfa-recovery-codes");
    list.textContent = "";
    codes.forEach((c) => list.append(el("li", c)));
    $("#tfa-recovery").hidden = false;
  }
  $("#tfa-enable-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = $("#tfa-enable-form");
    const done = await act(form, $('button[type="submit"]', form), () =>
      api("POST", "/auth/2fa/enable", { code: $("#tfa-code").value.trim() }));
    if (!done) return;
    form.reset();
    form.hidden = true;
    $("#tfa-secret").textContent = "";
    showRecoveryCodes(done.recovery_codes);
    loadSecurity();
  });
  $("#tfa-recovery-done").addEventListener("click", () => {
    $("#tfa-recovery").hidden = true;
    $("#tfa-recovery-codes").textContent = "";
  });
  $("#tfa-regenerate-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = $("#tfa-regenerate-form");
    const done = await act(form, $('button[type="submit"]', form), () =>
      api("POST", "/auth/2fa/recovery-codes", { code: $("#tfa-regenerate-code").value.trim() }));
    if (!done) return;
    form.reset();
    showRecoveryCodes(done.recovery_codes);
    loadSecurity();
  });
  $("#tfa-disable-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = $("#tfa-disable-form");
    const code = $("#tfa-disable-code").value.trim();
    const body = code ? { code } : { password: $("#tfa-disable-password").value };
    if (!(await confirmAction("Turn off two-factor sign-in?", "Your password alone will sign you in.", "Turn off"))) return;
    if (await act(form, $('button[type="submit"]', form), () => api("POST", "/auth/2fa/disable", body))) {
      form.reset();
      $("#tfa-recovery").hidden = true;
      loadSecurity();
    }
  });

  // The audit log (Activity view): filters, pages of 50, CSV and JSON exports of what the filters select.
  const ACTION_LABELS = {
    "account.created": "Account created", "login": "Signed in", "login.failed": "Failed sign-in", "logout": "Signed out",
    "password.changed": "Password changed", "password.reset_requested": "Password reset asked",
    "password.reset": "Password reset", "2fa.enabled": "Two-factor turned on", "2fa.disabled": "Two-factor turned off",
    "2fa.failed": "Wrong two-factor code", "2fa.recovery_used": "Recovery code used",
    "2fa.recovery_regenerated": "New recovery codes", "key.created": "Key created", "key.revealed": "Key revealed",
    "key.rolled": "Key rolled", "key.revoked": "Key revoked", "key.edited": "Key edited",
    "budget.changed": "Budget changed", "checkout.created": "Order created", "credit.applied": "Credits added",
    "webhook.created": "Webhook endpoint added", "webhook.deleted": "Webhook endpoint deleted",
    "admin.credit": "Credited by an admin", "admin.debit": "Debited by an admin",
    "admin.suspend": "Suspended by an admin", "admin.resume": "Resumed by an admin",
  };
  const actionSelect = $("#audit-action");
  Object.entries(ACTION_LABELS).forEach(([value, label]) => {
    const option = el("option", label);
    option.value = value;
    actionSelect.append(option);
  });
  function auditQuery() {
    const params = new URLSearchParams();
    if (actionSelect.value) params.set("action", actionSelect.value);
    if ($("#audit-since").value) params.set("since", $("#audit-since").value + "T00:00:00Z");
    if ($("#audit-until").value) params.set("until", $("#audit-until").value + "T23:59:59Z");
    const everyone = state.me && state.me.is_admin && $("#audit-all").checked;
    if (everyone && $("#audit-account").value.trim()) params.set("account_id", $("#audit-account").value.trim());
    return [everyone ? "/admin/audit" : "/audit", params];
  }
  function actorText(actor) {
    if (actor.kind === "system") return "the system";
    if (actor.kind === "anonymous") return "someone not signed in";
    if (actor.kind === "admin") return "admin " + (actor.email || actor.id);
    return state.me && actor.id === state.me.account_id ? "you" : "account " + actor.id;
  }
  function detailsText(entry) {
    const d = Object.assign({}, entry.details);
    const parts = Object.entries(d).map(([k, v]) => k.replace(/_/g, " ") + ": " +
      (v !== null && typeof v === "object" ? JSON.stringify(v) : String(v)));
    if (state.me && entry.account_id && entry.account_id !== state.me.account_id) parts.unshift("account: " + entry.account_id);
    return parts.join(" · ") || "—";
  }
  async function loadAudit(more) {
    const form = $("#audit-filters");
    $$("[data-admin-only]", form).forEach((n) => (n.hidden = !(state.me && state.me.is_admin)));
    const [path, params] = auditQuery();
    ["csv", "json"].forEach((fmt) => {
      const exported = new URLSearchParams(params);
      exported.set("format", fmt);
      $("#audit-" + fmt).href = path + "/export?" + exported;
    });
    params.set("limit", "50");
    if (more && security.auditCursor) params.set("cursor", security.auditCursor);
    const page = await act(form, $('button[type="submit"]', form), () => api("GET", path + "?" + params));
    if (!page) return;
    security.auditCursor = page.next_cursor;
    $("#audit-more").hidden = !page.next_cursor;
    if (page.retention_days) $("#audit-retention").textContent = "for " + page.retention_days + " days";
    const body = $("#audit-table tbody");
    if (!more) body.textContent = "";
    page.entries.forEach((entry) => {
      const row = el("tr");
      row.dataset.testid = "audit-row";
      cell(row, when(entry.at), "nowrap");
      cell(row, ACTION_LABELS[entry.action] || entry.action);
      cell(row, actorText(entry.actor), "wrap-any");
      cell(row, entry.address || "—", "wrap-any");
      cell(row, detailsText(entry), "wrap-any");
      body.append(row);
    });
    $("#audit-empty").hidden = body.rows.length > 0;
    labelCells($("#audit-table"));
  }
  $("#audit-filters").addEventListener("submit", (event) => {
    event.preventDefault();
    loadAudit(false);
  });
  $("#audit-more").addEventListener("click", () => loadAudit(true));
  LOADERS.security = loadSecurity;
  LOADERS.activity = () => loadAudit(false);
  // --- real time: filter rules and monitors (docs/streams.md); self-contained -----------------------
  const streamForm = $("#stream-form");
  const LEAST_PER_POLL = 15; // the search's per-call minimum (metering/pricing.py); rows carry the server's figure
  const MIN_INTERVAL = Number(document.body.dataset.streamMinInterval) || 10; // this server's STREAM_MIN_INTERVAL
  // The server's own check (handlers/streams.py checked_interval), in its words: an interval it would refuse is
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

  async function loadStreams() {
    clearError(streamForm);
    streamFields();
    await act(streamForm, null, async () => drawStreams(await api("GET", "/streams")));
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
      toggle.addEventListener("click", async () => {
        const path = "/streams/" + r.rule_id;
        if (await act(streamForm, toggle, () => api("PATCH", path, { active: on }))) loadStreams();
      });
      const log = button("Deliveries", "secondary small", "stream-deliveries");
      log.addEventListener("click", () => showStreamEvents(r));
      const remove = button("Delete", "danger small", "delete-stream");
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

  async function showStreamEvents(r) {
    const box = $("#stream-events-box");
    box.hidden = false;
    $("#stream-events-title").textContent = "Recent deliveries of " + r.tag;
    const rows = await act(box, null, () => api("GET", "/streams/" + r.rule_id + "/events?limit=50"));
    if (!rows) return;
    fillTable("#stream-events-table", "#stream-events-empty", rows, "stream-event-row", (row, e) => {
      cell(row, e.event_id);
      cell(row, String(e.tweets.length), "num");
      cell(row, e.tweets.length ? (e.tweets[0].text || "").slice(0, 80) : "—");
      cell(row, when(e.created_at));
    });
    box.scrollIntoView({ block: "nearest" });
  }

  window.addEventListener("hashchange", route);
  start();
})();
