// The members view: who shares this account's balance and with which role, their invitations, and the changes an
// owner or admin makes (handlers/members/). Who may change what is the server's to say: a refused change shows
// its words in the row; controls a role cannot use at all are disabled with the reason (roles.js).
import { $, button, cell, confirmAction, el, fillTable, rowError, when } from "./dom.js";
import { act, api, listGeneration, showError, state } from "./api.js";
import { may } from "./roles.js";

const ROLES = ["owner", "admin", "developer", "billing", "viewer"];
const scope = $("#view-members");

const membersList = listGeneration(); // a slow earlier list must not bring back a member removed since
export async function loadMembers() {
  const list = membersList.restart();
  let members;
  try {
    members = await api("GET", "/members");
  } catch (err) {
    showError(scope, err);
    return;
  }
  if (!membersList.isCurrent(list)) return;
  const owners = members.filter((m) => m.role === "owner").length;
  fillTable("#members-table", "#members-empty", members, "member", (row, m) => drawMember(row, m, owners));
  const managing = may("get /members/invitations");
  $("#invitations-box").hidden = !managing;
  if (managing) loadInvitations();
}

function drawMember(row, m, owners) {
  const mine = m.member_id === state.me.member_id;
  cell(row, m.email + (mine ? " (you)" : ""), "path");
  const roleCell = cell(row, "");
  const failed = rowError();
  if (may("patch /members/{member_id}") && !mine) {
    const picker = el("select");
    picker.dataset.testid = "member-role";
    picker.setAttribute("aria-label", "Role of " + m.email);
    ROLES.forEach((r) => {
      const option = el("option", r);
      option.value = r;
      option.selected = r === m.role;
      picker.append(option);
    });
    picker.addEventListener("change", async () => {
      const done = await act(row, picker, () =>
        api("PATCH", "/members/" + m.member_id, { role: picker.value }));
      if (done === undefined) picker.value = m.role; // refused: its reason is shown in the row
      else if ((m.role === "owner") !== (done.role === "owner")) loadMembers(); // who is the last owner changed
      else m.role = done.role;
    });
    roleCell.append(picker);
  } else {
    roleCell.textContent = m.role;
  }
  cell(row, m.two_factor ? "on" : "off");
  cell(row, when(m.joined_at));
  cell(row, when(m.last_seen_at));
  const actions = cell(row, "");
  if (m.role === "owner" && owners < 2) {
    // The server refuses the last owner's leaving or removal (409): say so, and why, before anyone tries.
    const note = el("p", mine ? "You are the only owner: make another member an owner before you leave." :
      "The only owner: another member must be made an owner first.", "hint");
    note.dataset.testid = "last-owner";
    actions.append(note);
    return;
  }
  const remove = button(mine ? "Leave" : "Remove", "danger small", mine ? "leave-account" : "remove-member");
  if (!mine) remove.dataset.op = "delete /members/{member_id}";
  remove.addEventListener("click", async () => {
    const ok = await confirmAction(
      mine ? "Leave this account?" : "Remove " + m.email + "?",
      mine ? "You lose access to this account's keys, usage and balance at once." :
        m.email + " loses access to this account at once. Keys they made keep working: they belong to the account.",
      mine ? "Leave" : "Remove");
    if (!ok) return;
    const done = await act(row, remove, () => api("DELETE", "/members/" + m.member_id));
    if (done === undefined) return;
    if (mine) location.reload(); // this session no longer opens the account
    else loadMembers();
  });
  actions.append(remove, failed);
}

const invitationsList = listGeneration(); // the view's slow first list must not hide an invitation made since
async function loadInvitations() {
  const list = invitationsList.restart();
  let pending;
  try {
    pending = await api("GET", "/members/invitations");
  } catch (err) {
    showError($("#invitations-box"), err);
    return;
  }
  if (!invitationsList.isCurrent(list)) return;
  fillTable("#invitations-table", "#invitations-empty", pending, "invitation", (row, i) => {
    cell(row, i.email, "path");
    cell(row, i.role);
    cell(row, when(i.expires_at));
    const revoke = button("Revoke", "secondary small", "revoke-invitation");
    revoke.dataset.op = "delete /members/invitations/{invitation_id}";
    revoke.addEventListener("click", async () => {
      if (await act(row, revoke, () => api("DELETE", "/members/invitations/" + i.invitation_id)) !== undefined) {
        loadInvitations();
      }
    });
    cell(row, "").append(revoke, rowError());
  });
}

const inviteForm = $("#invite-form");
inviteForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  const sent = $("#invite-sent");
  sent.hidden = true;
  const body = { email: $("#invite-email").value.trim(), role: $("#invite-role").value };
  const done = await act(inviteForm, $('button[type="submit"]', inviteForm), () =>
    api("POST", "/members/invitations", body));
  if (done === undefined) return;
  inviteForm.reset();
  sent.textContent = "Invitation for " + done.email + " (" + done.role + ") made; it works once, until " +
    when(done.expires_at) + ". It is emailed when the server has SMTP_URL.";
  if (done.token) {
    // Development only: the link itself, so a team can be tried without an inbox.
    const link = el("a", "Invitation link");
    link.href = location.origin + "/#invitation=" + encodeURIComponent(done.token);
    link.dataset.testid = "invitation-link";
    sent.append(" ", link);
  }
  sent.hidden = false;
  loadInvitations();
});
