// Signing in and out: the page's start, register and log in (with the second factor's step), log out, the
// session's end, forgotten password and the emailed reset link (handlers/auth/: handlers.py, twofactor.py, reset.py).
import { $, $$, FEATURES, el, when } from "./dom.js";
import { ApiFailure, act, api, clearError, onSessionEnd, showError, state } from "./api.js";
import { VIEWS, currentView, route } from "./views.js";
import { loadAccount, passwordChange } from "./account.js";
import { hideSecret } from "./keys.js";
import { stopOrderPolling } from "./billing.js";
import { applyRoles, loadRoles } from "./roles.js";

const AUTH_PANELS = ["#auth-form", "#second-factor-form", "#forgot-form", "#reset-form", "#accept-form"];
// the second factor's challenge, the emailed reset token, an invitation's token (/#invitation=<token>), and the
// credentials of a login that starts an account of its own while its second factor is asked for
const pending = { challenge: null, resetToken: null, invitation: null, ownAccount: null };

export async function start() {
  FEATURES.forEach((f) => $$('[data-feature="' + f + '"]').forEach((n) => (n.hidden = false)));
  if (takeInvitation()) {
    showAcceptForm(document.body.dataset.signedIn === "yes");
    return;
  }
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

async function signedIn(me) {
  state.me = me;
  try {
    await loadRoles(); // what this member's role may do: from the server's own declarations
  } catch (err) {
    console.warn("roles", err.message); // the server still refuses what the role cannot do
  }
  exampleCall("USER_NAME");
  if (FEATURES.has("sandbox")) {
    // A user the development sandbox knows, so that the example answers with data.
    api("GET", "/sandbox/catalog").then((c) => c.users && c.users[0] && exampleCall(c.users[0].userName), () => {});
  }
  drawWho(me);
  $("#view-auth").hidden = true;
  $("#nav").hidden = false;
  $("#who").hidden = false;
  $('#nav a[data-view="admin"]').hidden = !me.is_admin;
  route();
  applyRoles(document);
  // Focus where the views are, for a screen reader, without scrolling past the navigation (and the balance warning).
  $("#main").focus({ preventScroll: true });
  if (currentView() !== "overview") loadAccount(null); // the balance warning shows on every view
}

function exampleCall(userName) {
  $("#example-call").textContent =
    'curl -H "X-API-Key: YOUR_KEY" "' + location.origin + "/social/user/info?userName=" + encodeURIComponent(userName) + '"';
}

function signedOut(message) {
  state.me = null;
  stopOrderPolling();
  VIEWS.forEach((v) => ($("#view-" + v).hidden = true));
  $("#nav").hidden = true;
  $("#who").hidden = true;
  $("#balance-warning").hidden = true;
  hideSecret();
  $("#view-auth").hidden = false;
  const scope = $("#auth-form");
  clearError(scope);
  if (message) showError(scope, new ApiFailure(401, message));
}

onSessionEnd(signedOut); // a 401 on a signed-in page

async function authenticate(path, trigger, extra) {
  const scope = $("#auth-form");
  const body = Object.assign({ email: $("#email").value.trim(), password: $("#password").value }, extra);
  $("#own-account-box").hidden = true;
  const done = await act(scope, trigger, async () => {
    let answer;
    try {
      answer = await api("POST", path, body);
    } catch (err) {
      // A sign-in in no account any more (removed from every one) may start an account of its own.
      if (err.status === 403 && /start an account of your own/.test(err.message)) $("#own-account-box").hidden = false;
      throw err;
    }
    if (answer && answer.two_factor_required) return answer; // the second step: askSecondFactor, below
    return api("GET", "/auth/me");
  });
  if (done) {
    $("#password").value = "";
    if (done.two_factor_required) {
      pending.ownAccount = body.own_account ? body : null; // sent again with the code (POST /portal/login)
      askSecondFactor(done.challenge);
    } else signedIn(done);
  }
}
$("#own-account").addEventListener("click", () =>
  authenticate("/portal/login", $("#own-account"), { own_account: true }));

$("#auth-form").addEventListener("submit", (event) => {
  event.preventDefault();
  authenticate("/portal/login", $("#login"));
});
$("#register").addEventListener("click", () => authenticate("/portal/register", $("#register")));
$("#logout").addEventListener("click", async () => {
  // A password change in flight answers with a new session cookie: let it land first, then end that session.
  if (passwordChange) await passwordChange;
  try {
    await api("POST", "/portal/logout");
  } catch (err) {
    console.warn("logout", err.message);
  }
  location.hash = "";
  signedOut("");
  authPanel("#auth-form", "You are signed out. Sign in again below, or close this tab.");
});


function authPanel(selector, notice) {
  AUTH_PANELS.forEach((s) => ($(s).hidden = s !== selector));
  $("#auth-title").textContent = selector === "#accept-form" ? "You are invited" : "Log in or create an account";
  AUTH_PANELS.forEach((s) => clearError($(s)));
  $("#auth-notice").textContent = notice || "";
  $("#auth-notice").hidden = !notice;
  const first = $("input", $(selector));
  if (first) first.focus();
}
$$("#view-auth [data-back]").forEach((b) => b.addEventListener("click", () => {
  if (!$("#accept-form").hidden && invited.withSession) {
    location.reload(); // not joining: back to the portal, still signed in (the link left the address bar)
    return;
  }
  pending.challenge = pending.resetToken = pending.ownAccount = null;
  authPanel("#auth-form");
}));

function askSecondFactor(challenge) {
  pending.challenge = challenge;
  $("#second-factor-code").value = "";
  authPanel("#second-factor-form");
}
$("#second-factor-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = $("#second-factor-form");
  const body = { challenge: pending.challenge, code: $("#second-factor-code").value.trim() };
  const own = pending.ownAccount;
  let mayStart = false;
  const me = await act(form, $('button[type="submit"]', form), async () => {
    try {
      if (own) await api("POST", "/portal/login", Object.assign({}, own, { code: body.code }));
      else await api("POST", "/portal/login/2fa", body);
    } catch (err) {
      mayStart = err.status === 403 && /start an account of your own/.test(err.message);
      throw err;
    }
    return api("GET", "/auth/me");
  });
  if (mayStart) {
    // In no account any more: the login form offers to start one (the password again, then a new code).
    pending.challenge = null;
    authPanel("#auth-form", "You are not a member of any account any more. Type your password again and choose " +
      "\u201cStart an account of my own\u201d, or ask an owner for an invitation.");
    $("#own-account-box").hidden = false;
    return;
  }
  if (me) {
    pending.challenge = pending.ownAccount = null;
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
  pending.resetToken = decodeURIComponent(location.hash.slice("#reset=".length));
  history.replaceState(null, "", location.pathname + location.search);
  return true;
}
if (takeResetToken()) document.body.dataset.signedIn = "no";
const showResetForm = () => { if (pending.resetToken) authPanel("#reset-form"); };
window.addEventListener("hashchange", () => {
  // A link opened in a tab already on the portal changes only the fragment: no new page load.
  if (!takeResetToken()) return;
  signedOut("");
  showResetForm();
});
$("#reset-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = $("#reset-form");
  const body = { token: pending.resetToken, password: $("#reset-password").value };
  const done = await act(form, $('button[type="submit"]', form), () => api("POST", "/auth/password/reset", body));
  if (done) {
    pending.resetToken = null;
    form.reset();
    authPanel("#auth-form", "Your password is changed and every session has ended: log in with the new password.");
  }
});


// The header says who is signed in (email, role here) and for which account: its name, else whose it is. A person in
// several accounts chooses which one the session acts for with the picker (POST /portal/switch).
function accountLabel(me, a) {
  if (a.name) return a.name;
  if (a.account_id === me.person_id) return "Your account";
  return a.email ? a.email + "\u2019s account" : "Account \u2026" + a.account_id.slice(-6);
}
function drawWho(me) {
  $("#who-email").textContent = me.email;
  $("#who-role").textContent = me.role;
  const current = me.accounts.find((a) => a.account_id === me.account_id);
  $("#who-account").textContent = current ? accountLabel(me, current) : "";
  const picker = $("#account-picker");
  picker.textContent = "";
  me.accounts.forEach((a) => {
    const option = el("option", accountLabel(me, a) + " (" + a.role + ")");
    option.value = a.account_id;
    option.selected = a.account_id === me.account_id;
    picker.append(option);
  });
  picker.hidden = me.accounts.length < 2;
  $("#who-account").hidden = !picker.hidden;
}
// An owner renamed the account (account.js): the header and the picker say the new name at once.
document.addEventListener("account-renamed", (event) => {
  if (!state.me) return;
  state.me.accounts.forEach((a) => { if (a.account_id === state.me.account_id) a.name = event.detail; });
  drawWho(state.me);
});
$("#account-picker").addEventListener("change", async (event) => {
  const picker = event.target;
  try {
    await api("POST", "/portal/switch", { account_id: picker.value });
    signedIn(await api("GET", "/auth/me"));
  } catch (err) {
    picker.value = state.me.account_id;
    showError($("#main"), err);
  }
});

// An invitation's link: /#invitation=<token>, taken out of the address bar at once (as a reset link). Signed in,
// joining takes one click; signed out, a password makes the new person's sign-in (or is their existing one's).
function takeInvitation() {
  if (!location.hash.startsWith("#invitation=")) return false;
  pending.invitation = decodeURIComponent(location.hash.slice("#invitation=".length));
  history.replaceState(null, "", location.pathname + location.search);
  return true;
}
// The invitation as its link shows it (POST /auth/invitations/preview): account, inviter, role, invited email.
// Signed in, joining is one click with that sign-in; signed out, a password makes (or is) the person's sign-in.
const invited = { label: "", role: "", withSession: false };
async function showAcceptForm(withSession) {
  signedOut("");
  const form = $("#accept-form");
  invited.withSession = withSession;
  $("#accept-facts").hidden = true;
  $("#accept-signed-in").hidden = true;
  $("#accept-progress").hidden = true;
  $("#accept-password-field").hidden = withSession;
  $("#accept-help").hidden = withSession;
  $("#accept-title").textContent = "Join an account";
  $("#accept-submit").textContent = "Join the account";
  authPanel("#accept-form", "");
  const token = pending.invitation;
  let preview;
  let me = null;
  try {
    preview = await api("POST", "/auth/invitations/preview", { token });
    if (withSession) me = await api("GET", "/auth/me").catch(() => null); // an ended session: as signed out
  } catch (err) {
    if (pending.invitation === token) showError(form, err);
    return;
  }
  if (pending.invitation !== token) return; // another link was opened meanwhile
  drawInvitation(preview, me);
}

function drawInvitation(preview, me) {
  invited.label = preview.account_name || "the account of " + (preview.account_email || "another member");
  invited.role = preview.role;
  invited.withSession = me !== null;
  const join = "Join " + invited.label + " as " + preview.role;
  $("#accept-title").textContent = join;
  $("#accept-account").textContent = preview.account_name ? preview.account_name + " (" + preview.account_email + ")" : preview.account_email || "—";
  $("#accept-inviter").textContent = preview.invited_by || "a member";
  $("#accept-role").textContent = preview.role;
  $("#accept-email").textContent = preview.email;
  $("#accept-expires").textContent = when(preview.expires_at);
  $("#accept-facts").hidden = false;
  $("#accept-password-field").hidden = me !== null;
  $("#accept-help").hidden = me !== null;
  $("#accept-submit").textContent = me ? join : "Join as " + preview.role;
  if (me) {
    const other = me.email !== preview.email ? "; the invitation was sent to " + preview.email + ", and joining adds this sign-in" : "";
    $("#accept-signed-in").textContent = "You are signed in as " + me.email + other + ".";
    $("#accept-signed-in").hidden = false;
  } else {
    $("#accept-help").textContent = "New here: choose a password for your own sign-in as " + preview.email +
      ". Already have a sign-in with " + preview.email + ": give its password.";
  }
}
window.addEventListener("hashchange", () => {
  if (takeInvitation()) showAcceptForm(state.me !== null || document.body.dataset.signedIn === "yes");
});
$("#accept-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = $("#accept-form");
  const body = { token: pending.invitation };
  if (!$("#accept-password-field").hidden) body.password = $("#accept-password").value;
  const submit = $("#accept-submit");
  const label = submit.textContent;
  // Joining with a password takes seconds: the password is hashed (or checked) slowly on purpose, as at
  // registration and login. Say so while it runs.
  const progress = $("#accept-progress");
  progress.textContent = body.password === undefined
    ? "Joining " + (invited.label || "the account") + "…"
    : "Joining: checking your password takes a few seconds (it is hashed slowly on purpose, against guessing)…";
  progress.hidden = false;
  submit.textContent = "Joining…";
  const me = await act(form, submit, async () => {
    await api("POST", "/portal/invitations/accept", body);
    return api("GET", "/auth/me");
  });
  progress.hidden = true;
  submit.textContent = label;
  if (me) {
    pending.invitation = null;
    form.reset();
    form.hidden = true;
    $("#auth-form").hidden = false;
    $("#auth-notice").hidden = true;
    $("#auth-title").textContent = "Log in or create an account"; // for the next time the page is signed out
    signedIn(me);
  }
});
