// The gateway's JSON API as the views call it, and its failures shown next to what caused them. The session is an
// HttpOnly cookie no script can read; writes carry the XSRF token from the page.
import { $, $$, fillTable } from "./dom.js";

// What the views share: who is signed in and their keys (each view keeps the rest to itself).
export const state = { me: null, keys: [] };

const XSRF = $('meta[name="xsrf-token"]').content;
const FIELD_LABELS = {
  email: "Email", password: "Password", name: "Name", amount_usd: "Amount (USD)", currency: "Currency",
  current_password: "Current password", new_password: "New password", body: "Request",
  expires_at: "Expires", allowed_endpoints: "Allowed endpoints", allowed_ips: "Allowed addresses",
  credit_limit: "Credit budget", credit_limit_period: "Budget period", grace_seconds: "Grace period",
  tag: "Tag", value: "Search", x_user_name: "Account", interval_seconds: "Interval", active: "Active",
  url: "URL", kind: "Rule", credits: "Amount", usd: "Amount", percent: "Amount", levels: "Levels",
};
const WHERE = new Set(["body", "query", "path", "header"]);

export class ApiFailure extends Error {
  constructor(status, message, fields, byField) {
    super(message);
    this.status = status;
    this.fields = fields || [];
    this.byField = byField || {}; // field name -> its messages, shown next to the field where a form has a slot
  }
}

// Set by the sign-in flow (session.js): what a 401 on a signed-in page does.
let sessionEnded = () => {};
export function onSessionEnd(handler) {
  sessionEnded = handler;
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

export async function api(method, path, body, headers) {
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
      sessionEnded("Your session has ended; log in again.");
    }
    throw new ApiFailure(response.status, message, fields, byField);
  }
  return data;
}

function errorBox(scope) {
  return $('[data-testid="error"]', scope);
}
export function clearError(scope) {
  const box = errorBox(scope);
  box.hidden = true;
  box.textContent = "";
  $$('[aria-invalid="true"]', scope).forEach((el) => el.removeAttribute("aria-invalid"));
  $$("[data-error-for]", scope).forEach((slot) => {
    slot.hidden = true;
    slot.textContent = "";
  });
}
export function showError(scope, err) {
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
// A list that starts over (the view opens, a filter or a search changes) drops the answers to requests made before:
// one that arrives late would otherwise be drawn over, or appended to, the newer list. `restart()` when the list
// starts over, keep `current()` before a request, and draw its answer only if `isCurrent(ticket)` still holds.
export function listGeneration() {
  let generation = 0;
  return {
    restart: () => ++generation,
    current: () => generation,
    isCurrent: (ticket) => ticket === generation,
  };
}

// Runs `work` with `button` busy and the scope's error box cleared first, filled on failure.
export async function act(scope, button, work) {
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

// A box listing an item's recent deliveries (a webhook endpoint's, a stream rule's), by one page convention:
// #<name>-box holds #<name>-title, #<name>-table and its #<name>-empty note. Shown, titled, filled from `path`
// (drawRow draws a row), scrolled into view. A slow earlier list (another item's) must not replace the one asked
// for since.
const recentShown = {};
export async function showRecent(name, title, path, testid, drawRow) {
  const shown = (recentShown[name] = recentShown[name] || listGeneration());
  const ticket = shown.restart();
  const box = $("#" + name + "-box");
  box.hidden = false;
  $("#" + name + "-title").textContent = title;
  const rows = await act(box, null, () => api("GET", path));
  if (!rows || !shown.isCurrent(ticket)) return;
  fillTable("#" + name + "-table", "#" + name + "-empty", rows, testid, drawRow);
  box.scrollIntoView({ block: "nearest" });
}
