// The overview: the balance (and its warning, shown on every view), the plan, the account's name, the password change.
import { $, el, number, usd } from "./dom.js";
import { act, api, listGeneration, showError } from "./api.js";

// Read from several places (each view, a payment's end): a slow earlier read must not put back an older balance.
const accountLoad = listGeneration();
export async function loadAccount(scope) {
  const load = accountLoad.restart();
  let account;
  try {
    account = await api("GET", "/account");
  } catch (err) {
    if (scope) showError(scope, err);
    return null;
  }
  if (!accountLoad.isCurrent(load)) return null;
  const worth = account.credits / account.credits_per_usd;
  $("#balance").textContent = number.format(account.credits) + " credits";
  $("#balance-usd").textContent = "worth " + usd.format(worth);
  $("#billing-balance").textContent = number.format(account.credits) + " credits";
  $("#plan").textContent = account.plan;
  $("#qps").textContent = "up to " + number.format(account.qps_limit) + " calls per second per key";
  $("#paid").textContent = usd.format(account.total_paid_usd);
  const name = $("#account-name");
  if (scope && document.activeElement !== name) name.value = account.name || ""; // never under the owner's typing
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

// A password change in flight answers with a new session cookie: logging out waits for it (session.js).
export let passwordChange = null;

const passwordForm = $("#password-form");
passwordForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  const ok = $(".ok", passwordForm);
  ok.hidden = true;
  const body = { current_password: $("#current-password").value, new_password: $("#new-password").value };
  passwordChange = act(passwordForm, $('button[type="submit"]', passwordForm), () =>
    api("POST", "/portal/password", body));
  const done = await passwordChange;
  passwordChange = null;
  if (done !== undefined) {
    passwordForm.reset();
    ok.textContent = "Password changed.";
    ok.hidden = false;
  }
});

const nameForm = $("#account-name-form");
nameForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  const ok = $(".ok", nameForm);
  ok.hidden = true;
  const done = await act(nameForm, $('button[type="submit"]', nameForm), () =>
    api("PATCH", "/account", { name: $("#account-name").value }));
  if (done === undefined) return;
  $("#account-name").value = done.name || "";
  ok.textContent = done.name ? "Saved: the account is now \u201c" + done.name + "\u201d." : "Saved: the account has no name.";
  ok.hidden = false;
  document.dispatchEvent(new CustomEvent("account-renamed", { detail: done.name }));
});
