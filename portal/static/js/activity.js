// The Activity view: the audit log (handlers/audit/handlers.py) with its filters, pages of 50, and CSV and JSON exports of what
// the filters select; an admin may read every account's.
import { $, $$, cell, el, labelCells, when } from "./dom.js";
import { act, api, listGeneration, state } from "./api.js";

let auditCursor = null; // where the next page starts
const auditList = listGeneration(); // a slow earlier filter's page must not replace the newer one's
// Every action storage/audit.py records (ACTIONS), in words: the "What" filter offers each one
// (tests/portal/test_browser_header.py holds the two lists together).
const ACTION_LABELS = {
  "account.created": "Account created", "account.renamed": "Account renamed", "login": "Signed in", "login.failed": "Failed sign-in", "logout": "Signed out",
  "password.changed": "Password changed", "password.reset_requested": "Password reset asked",
  "password.reset": "Password reset", "2fa.enabled": "Two-factor turned on", "2fa.disabled": "Two-factor turned off",
  "2fa.failed": "Wrong two-factor code", "2fa.recovery_used": "Recovery code used",
  "2fa.recovery_regenerated": "New recovery codes", "key.created": "Key created", "key.revealed": "Key revealed",
  "key.rolled": "Key rolled", "key.revoked": "Key revoked", "key.edited": "Key edited",
  "budget.changed": "Budget changed", "checkout.created": "Order created", "credit.applied": "Credits added",
  "billing.details_changed": "Billing details changed", "receipt.voided": "Receipt voided by an admin",
  "webhook.created": "Webhook endpoint added", "webhook.deleted": "Webhook endpoint deleted",
  "admin.credit": "Credited by an admin", "admin.debit": "Debited by an admin",
  "admin.suspend": "Suspended by an admin", "admin.resume": "Resumed by an admin",
  "member.invited": "Member invited", "member.invitation_revoked": "Invitation revoked",
  "member.joined": "Member joined", "member.role_changed": "Member's role changed",
  "member.removed": "Member removed", "member.left": "Member left",
  "mcp.connected": "AI agent connected (MCP)",
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
  // A member acting for the account (actor.id is the account, whoever acted): you by your membership or your
  // email (one person, one email; another account's entries, for an admin), anyone else by their email.
  const me = state.me;
  if (actor.member_id) {
    const mine = me && (actor.member_id === me.member_id || (actor.email && actor.email === me.email));
    return mine ? "you" : actor.email || "member " + actor.member_id;
  }
  // Written before accounts had members: the one who registered the account (their id is the account's) acted.
  return me && actor.id === me.person_id ? "you" : "account " + actor.id;
}
function detailsText(entry) {
  const d = Object.assign({}, entry.details);
  const parts = Object.entries(d).map(([k, v]) => k.replace(/_/g, " ") + ": " +
    (v !== null && typeof v === "object" ? JSON.stringify(v) : String(v)));
  if (state.me && entry.account_id && entry.account_id !== state.me.account_id) parts.unshift("account: " + entry.account_id);
  return parts.join(" · ") || "—";
}
export async function loadAudit(more) {
  const form = $("#audit-filters");
  $$("[data-admin-only]", form).forEach((n) => (n.hidden = !(state.me && state.me.is_admin)));
  const [path, params] = auditQuery();
  ["csv", "json"].forEach((fmt) => {
    const exported = new URLSearchParams(params);
    exported.set("format", fmt);
    $("#audit-" + fmt).href = path + "/export?" + exported;
  });
  params.set("limit", "50");
  if (more && auditCursor) params.set("cursor", auditCursor);
  const list = more ? auditList.current() : auditList.restart();
  const page = await act(form, $('button[type="submit"]', form), () => api("GET", path + "?" + params));
  if (!page || !auditList.isCurrent(list)) return;
  auditCursor = page.next_cursor;
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
