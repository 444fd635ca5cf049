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
    constructor(status, message, fields) {
      super(message);
      this.status = status;
      this.fields = fields || [];
    }
  }

  let pending = 0;
  function busy(delta) {
    pending += delta;
    $("#busy").hidden = pending === 0;
  }

  function readable(status, body) {
    // 422: {"detail": [{loc, msg, type}]}; other portal errors: {"detail": "..."}; data plane: {"msg": "..."}.
    if (body && Array.isArray(body.detail)) {
      // loc is ["body", field] or, for a list item, ["body", field, index]: name the field as its form does.
      const fields = body.detail.map((e) => String(e.loc.find((part) => typeof part === "string" && !WHERE.has(part)) || ""));
      const text = body.detail
        .map((e, i) => {
          const index = e.loc.find((part) => typeof part === "number");
          const name = FIELD_LABELS[fields[i]] || fields[i] || "Input";
          const msg = /^String should have at least 1 characters?$/.test(e.msg) ? "this field is required" : e.msg;
          return name + (index === undefined ? "" : " (item " + (index + 1) + ")") + ": " + msg;
        })
        .join("; ");
      return [text, fields.filter(Boolean)];
    }
    if (body && typeof body.detail === "string") return [body.detail, []];
    if (body && typeof body.msg === "string") return [body.msg, []];
    if (status === 0) return ["The gateway cannot be reached; check your connection and try again.", []];
    return ["The request failed (HTTP " + status + ").", []];
  }

  async function api(method, path, body) {
    const init = { method, credentials: "same-origin", headers: { Accept: "application/json" } };
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
      const [message, fields] = readable(response.status, data);
      if (response.status === 401 && state.me && !path.startsWith("/portal/")) {
        signedOut("Your session has ended; log in again.");
      }
      throw new ApiFailure(response.status, message, fields);
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
  }
  function showError(scope, err) {
    const box = errorBox(scope);
    box.textContent = err instanceof ApiFailure ? err.message : "Something went wrong in this page: " + err;
    box.hidden = false;
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
    return isNaN(d) ? String(iso) : d.toISOString().slice(0, 16).replace("T", " ");
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
  }

  function signedIn(me) {
    state.me = me;
    $("#example-call").textContent =
      'curl -H "X-API-Key: YOUR_KEY" "' + location.origin + '/social/user/info?userName=jack"';
    $("#who-email").textContent = me.email;
    $("#view-auth").hidden = true;
    $("#nav").hidden = false;
    $("#who").hidden = false;
    $('#nav a[data-view="admin"]').hidden = !me.is_admin;
    route();
    $("#main").focus();
    if (currentView() !== "overview") loadAccount(null); // the balance warning shows on every view
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
      await api("POST", path, body);
      return api("GET", "/auth/me");
    });
    if (done) {
      $("#password").value = "";
      signedIn(done);
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

  function drawKeys() {
    const body = $("#keys-table tbody");
    body.textContent = "";
    $("#keys-empty").hidden = state.keys.length > 0;
    state.keys.forEach((key) => {
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
      const expired = !key.revoked && key.expires_at && new Date(key.expires_at) <= new Date();
      const word = key.revoked ? "revoked" : expired ? "expired" : "active";
      stateCell.append(el("span", word, word === "active" ? "badge" : "badge off"));
      const actions = cell(row, "", "actions");
      const reveal = button("Reveal", "secondary small");
      reveal.setAttribute("aria-label", "Reveal key " + key.name);
      reveal.addEventListener("click", () => toggleReveal(key, code, reveal));
      actions.append(reveal);
      if (!key.revoked) {
        if (FEATURES.has("key-edit")) {
          const edit = button("Edit", "secondary small");
          edit.setAttribute("aria-label", "Edit key " + key.name);
          edit.addEventListener("click", () => editKey(key));
          actions.append(edit);
        }
        if (FEATURES.has("key-roll")) {
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
      "Calls with this key will be refused at once. This cannot be undone.",
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
      "A new secret with the same properties replaces this one; the old secret stops working after the grace period.",
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
    $("#edit-expires").value = key.expires_at ? new Date(key.expires_at).toISOString().slice(0, 16) : "";
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
    const expires = $("#edit-expires").value;
    wanted.expires_at = expires ? new Date(expires + "Z").toISOString() : null;
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
        // Totals computed by the server over every call; the table shows only the latest ones.
        const [byDay, byEndpoint, latest] = await Promise.all([
          api("GET", "/usage/summary?days=" + days + "&group_by=day"),
          api("GET", "/usage/summary?days=" + days + "&group_by=endpoint"),
          api("GET", "/usage?days=" + days + "&limit=50"),
        ]);
        byDay.forEach((r) => perDay.has(r.day) && perDay.set(r.day, { calls: r.calls, credits: r.credits }));
        byEndpoint.forEach((r) => perEndpoint.set(r.endpoint, { calls: r.calls, credits: r.credits }));
        drawChart($("#usage-chart"), $("#usage-totals"), perDay, days);
        drawEndpoints(perEndpoint);
        drawCalls(latest);
        offerCsv(latest, days);
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

  function drawChart(box, totalsLine, perDay, days) {
    box.textContent = "";
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

  function drawEndpoints(perEndpoint) {
    const body = $("#endpoints-table tbody");
    body.textContent = "";
    Array.from(perEndpoint.entries())
      .sort((a, b) => b[1].credits - a[1].credits || b[1].calls - a[1].calls)
      .forEach(([endpoint, v]) => {
        const row = el("tr");
        cell(row, endpoint);
        cell(row, number.format(v.calls), "num");
        cell(row, number.format(v.credits), "num");
        body.append(row);
      });
  }

  function drawCalls(records) {
    const body = $("#calls-table tbody");
    body.textContent = "";
    $("#calls-empty").hidden = records.length > 0;
    records.forEach((r) => {
      const row = el("tr");
      row.dataset.testid = "usage-row";
      cell(row, r.endpoint);
      cell(row, when(r.timestamp), "nowrap");
      cell(row, String(r.status), "num");
      cell(row, number.format(r.credits), "num");
      const id = cell(row, "");
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
          const option = el("option", c.name + " (" + c.code + ") — from " + usd.format(c.min_usd));
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
    $("#order-expiry").textContent = when(order.expires_at) + " UTC";
    const open = !FINAL.has(order.status);
    $("#order-note").textContent = open
      ? "Waiting for the payment; this status updates on its own."
      : order.status === "finished" ? "Paid: the credits are on your balance." : "This order is closed.";
    $$(".sandbox button", orderBox).forEach((b) => (b.disabled = !open));
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
    orders.forEach((o) => {
      const row = el("tr");
      const first = cell(row, "");
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
    const query = "/admin/users?limit=50" + internal + (state.usersCursor ? "&cursor=" + encodeURIComponent(state.usersCursor) : "");
    const page = await api("GET", query);
    const body = $("#users-table tbody");
    page.users.forEach((u) => {
      const row = el("tr");
      cell(row, u.email + (u.is_admin ? " (admin)" : ""));
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
    fillTable("#webhooks-table", "#endpoints-empty", endpoints, "endpoint-row", (row, endpoint) => {
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
    $("#endpoint-secret-box").hidden = false;
  }

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

  // --- real time: filter rules and monitors (docs/streams.md); self-contained -----------------------
  const streamForm = $("#stream-form");
  const LEAST_PER_POLL = 15; // the search's per-call minimum (metering/pricing.py); rows carry the server's figure
  function streamFields() {
    const monitor = $("#stream-kind").value === "monitor";
    $$('[data-for="rule"]', streamForm).forEach((n) => (n.hidden = monitor));
    $("#stream-value-label").textContent = monitor ? "Account (@handle)" : "Search";
    $("#stream-value").name = monitor ? "x_user_name" : "value";
    $("#stream-value").placeholder = monitor ? "@handle" : "bitcoin lang:en";
    const every = Number($("#stream-interval").value);
    const polls = every > 0 ? Math.ceil(86400 / every) : 0;
    $("#stream-cost").textContent = polls
      ? "At least " + (polls * LEAST_PER_POLL).toLocaleString() + " credits a day (" + polls.toLocaleString() +
        " polls), plus each new post's price."
      : "";
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
