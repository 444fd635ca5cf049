// The Security view: two-factor sign-in turned on (QR code, first code, recovery codes: copied or downloaded as a
// text file) and off, new recovery codes.
import { $, confirmAction, copy, el, when } from "./dom.js";
import { act, api, listGeneration, state } from "./api.js";

const statusLoad = listGeneration(); // a slow earlier status must not undo a change made since

export async function loadSecurity() {
  const card = $("#tfa-card");
  const load = statusLoad.restart();
  const status = await act(card, null, () => api("GET", "/auth/2fa"));
  if (!status || !statusLoad.isCurrent(load)) return;
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
let shownCodes = [];
function showRecoveryCodes(codes) {
  shownCodes = codes;
  const list = $("#tfa-recovery-codes");
  list.textContent = "";
  codes.forEach((c) => list.append(el("li", c)));
  $("#tfa-recovery-status").textContent = "";
  // The file is made here, in the page: the codes are never sent anywhere again.
  const made = new Date().toISOString().slice(0, 10);
  const text = "Recovery codes for " + (state.me ? state.me.email : "your sign-in") + " at " + location.host +
    ", made " + made + ".\nEach signs you in once, in place of the code from your phone.\n\n" + codes.join("\n") + "\n";
  const link = $("#tfa-recovery-download");
  forgetDownload();
  link.href = URL.createObjectURL(new Blob([text], { type: "text/plain" }));
  link.download = "recovery-codes-" + location.hostname + "-" + made + ".txt";
  $("#tfa-recovery").hidden = false;
}
function forgetDownload() {
  const link = $("#tfa-recovery-download");
  if (link.href.startsWith("blob:")) URL.revokeObjectURL(link.href);
  link.href = "#security";
  link.removeAttribute("download");
}
function hideRecoveryCodes() {
  shownCodes = [];
  forgetDownload();
  $("#tfa-recovery").hidden = true;
  $("#tfa-recovery-codes").textContent = "";
}
$("#tfa-recovery-copy").addEventListener("click", () => copy(shownCodes.join("\n"), $("#tfa-recovery-status")));
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
$("#tfa-recovery-done").addEventListener("click", hideRecoveryCodes);
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
    hideRecoveryCodes();
    loadSecurity();
  }
});

