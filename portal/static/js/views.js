// The views and the address bar: #keys shows the keys view and loads it; each view's module draws it.
import { $, $$ } from "./dom.js";
import { state } from "./api.js";
import { loadAccount } from "./account.js";
import { loadKeys } from "./keys.js";
import { loadUsage } from "./usage.js";
import { loadPrices } from "./prices.js";
import { loadBilling } from "./billing.js";
import { loadAlerts } from "./alerts.js";
import { loadStreams } from "./streams.js";
import { loadAdmin } from "./admin.js";
import { loadSecurity } from "./security.js";
import { loadAudit } from "./activity.js";
import { loadMembers } from "./members.js";
import { loadAgents } from "./agents.js";

// A view's name is its section's id (#view-<name>) and its nav link's data-view.
const LOADERS = {
  overview: () => loadAccount($("#view-overview")),
  keys: loadKeys,
  usage: loadUsage,
  prices: loadPrices,
  billing: loadBilling,
  alerts: loadAlerts,
  streams: () => loadStreams(),
  admin: loadAdmin,
  security: loadSecurity,
  activity: () => loadAudit(false),
  members: loadMembers,
  agents: loadAgents,
};
export const VIEWS = Object.keys(LOADERS);

export function currentView() {
  const name = location.hash.slice(1);
  if (name === "admin" && !(state.me && state.me.is_admin)) return "overview";
  return VIEWS.includes(name) ? name : "overview";
}

export function route() {
  if (!state.me) return;
  const name = currentView();
  VIEWS.forEach((v) => ($("#view-" + v).hidden = v !== name));
  $$("#nav a[data-view]").forEach((a) => {
    if (a.dataset.view === name) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  });
  LOADERS[name]();
}
