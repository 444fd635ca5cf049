// What the signed-in member's role may do here, from the server's own declarations: each operation's least role
// (x-least-role in /openapi.json) and which roles each least role admits (x-role-grants). A control that calls an
// operation names it in data-op ("post /keys"); one the role cannot use is disabled, with the reason beside it.
// The server refuses such calls anyway (403): this only spares a member a button that cannot work.
import { $$, el } from "./dom.js";
import { state } from "./api.js";

const declared = { least: {}, grants: null };

export async function loadRoles() {
  if (declared.grants) return;
  const doc = await (await fetch("/openapi.json", { credentials: "same-origin" })).json();
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(item)) {
      if (op["x-least-role"]) declared.least[method + " " + path] = op["x-least-role"];
    }
  }
  declared.grants = doc["x-role-grants"];
}

// The roles an operation admits, or null when any member may call it.
export function rolesFor(op) {
  const least = declared.least[op];
  return least && declared.grants ? declared.grants[least] : null;
}

export function may(op) {
  const admitted = rolesFor(op);
  return !admitted || (state.me && admitted.includes(state.me.role));
}

export function reason(op) {
  return "Your role in this account is " + state.me.role + ": this needs " + rolesFor(op).join(", ") + ".";
}

// Disables (or enables again, after a switch of account) one control; a form's submit button also gets its
// reason written under it, a row's button in its tooltip and accessible description.
function guard(node) {
  const op = node.dataset.op;
  const allowed = may(op);
  node.disabled = !allowed;
  node.title = allowed ? "" : reason(op);
  if (allowed) node.removeAttribute("aria-description");
  else node.setAttribute("aria-description", reason(op));
  const form = node.type === "submit" ? node.closest("form") : null;
  if (!form) return;
  let note = form.querySelector(".role-note");
  if (!note && !allowed) {
    note = el("p", "", "muted role-note");
    note.dataset.testid = "role-note";
    form.append(note);
  }
  if (note) {
    note.textContent = allowed ? "" : reason(op);
    note.hidden = allowed;
  }
}

export function applyRoles(root) {
  if (!state.me || !declared.grants) return;
  $$("[data-op]", root).forEach(guard);
}

// Rows drawn later (keys, rules, endpoints) are guarded as they appear.
new MutationObserver((changes) => {
  for (const change of changes) {
    change.addedNodes.forEach((node) => {
      if (node.nodeType !== 1) return;
      if (node.dataset && node.dataset.op) applyRoles(node.parentNode);
      else applyRoles(node);
    });
  }
}).observe(document.getElementById("main"), { childList: true, subtree: true });
