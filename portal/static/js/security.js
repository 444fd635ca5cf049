// The Security view: two-factor sign-in turned on (QR code, first code, recovery codes) and off, new recovery codes.
import { $, confirmAction, el, when } from "./dom.js";
import { act, api, listGeneration } from "./api.js";

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

