// Buying credits: the currencies, a checkout and its order (QR code, status polled until final), past orders, the
// sandbox's simulated payments, the account's receipts (each as a PDF download) and its billing details; the monthly
// statements below them (statements.js).
import { $, $$, button, cell, copy, el, labelCells, number, usd, when } from "./dom.js";
import { ApiFailure, act, api, clearError, listGeneration, showError, state } from "./api.js";
import { loadAccount } from "./account.js";
import { may } from "./roles.js";
import { loadStatements } from "./statements.js";

const checkoutForm = $("#checkout-form");
const orderBox = $("#order");
let currencies = [];
let current = null; // the order on show
let pollTimer = null;
const FINAL = new Set(["finished", "failed", "refunded", "expired"]);

export async function loadBilling() {
  loadAccount(null);
  loadStatements();
  await act(checkoutForm, null, async () => {
    if (!currencies.length) {
      const config = await api("GET", "/billing/crypto/config");
      currencies = config.currencies;
      $("#price-line").textContent = "1 USD buys " + number.format(config.credits_per_usd) + " credits.";
      const select = $("#checkout-currency");
      select.textContent = "";
      currencies.forEach((c) => {
        // Short enough to show whole in the picker on a phone: the name says the network, the hint the code.
        const option = el("option", c.name + " — from " + usd.format(c.min_usd));
        option.value = c.code;
        select.append(option);
      });
      if (!currencies.length) throw new ApiFailure(503, "Crypto payments are not configured on this server.");
      minimumChanged();
    }
    await loadOrders();
  });
  // Receipts and billing details are for owners, admins and billing members: others are not shown them.
  const documents = $("#billing-documents");
  documents.hidden = !may("get /billing/receipts");
  if (!documents.hidden) await act(documents, null, () => Promise.all([loadReceipts(), loadDetails()]));
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

const orderShown = listGeneration(); // a status poll made before the order on show changed is dropped
function showOrder(order) {
  orderShown.restart();
  const before = current;
  current = order;
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
  $("#order-expiry").textContent = when(order.expires_at);
  const open = !FINAL.has(order.status);
  // A closed order has nothing left to pay: no QR code, no deadline.
  $("#order-qr").hidden = !open;
  $$(".open-only", orderBox).forEach((n) => (n.hidden = !open));
  $("#order-note").textContent = open
    ? "Waiting for the payment; this status updates on its own."
    : order.status === "finished" ? "Paid: the credits are on your balance." : "This order is closed.";
  $("#sandbox-pay").disabled = !open;
  // Confirming needs a payment to confirm: enabled once some of it arrived unconfirmed.
  const unconfirmed = Number(order.amount_received.amount) > Number(order.amount_confirmed.amount);
  const confirm = $("#sandbox-confirm");
  confirm.disabled = !(open && unconfirmed);
  confirm.title = confirm.disabled ? "Simulate a payment first: then the network can confirm it" : "";
  if (before && before.order_id === order.order_id && before.credits_applied !== order.credits_applied) {
    loadAccount(null);
    loadStatements(); // the top-up is a credit added to this month's statement
  }
  if (before && before.order_id === order.order_id && before.status !== order.status) {
    loadOrders().catch((err) => showError(orderBox, err));
  }
  if (open) pollOrder();
  else {
    stopOrderPolling();
    loadAccount(null);
    // A settled order has its receipt now.
    if (!$("#billing-documents").hidden) loadReceipts().catch((err) => showError($("#billing-documents"), err));
  }
}

export function stopOrderPolling() {
  clearTimeout(pollTimer);
  pollTimer = null;
}
function pollOrder() {
  stopOrderPolling();
  const id = current.order_id;
  pollTimer = setTimeout(async () => {
    if (!state.me || !current || current.order_id !== id) return;
    const shown = orderShown.current();
    try {
      const order = await api("GET", "/billing/crypto/orders/" + encodeURIComponent(id));
      if (orderShown.isCurrent(shown)) showOrder(order);
    } catch (err) {
      showError(orderBox, err);
      if (err.status !== 401) pollOrder();
    }
  }, 2000);
}

const ordersList = listGeneration(); // the view's slow first list must not hide an order made since
async function loadOrders() {
  const list = ordersList.restart();
  const orders = await api("GET", "/billing/crypto/orders?limit=20");
  if (!ordersList.isCurrent(list)) return;
  const body = $("#orders-table tbody");
  body.textContent = "";
  $("#orders-empty").hidden = orders.length > 0;
  $("#orders-table").hidden = orders.length === 0;
  orders.forEach((o) => {
    const row = el("tr");
    const first = cell(row, "", "path");
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
  const order = current;
  const paid = await act(orderBox, $("#sandbox-pay"), () =>
    api("POST", "/billing/crypto/sandbox/pay", { order_id: order.order_id, amount_usd: order.price_usd, confirmed: false }));
  if (paid) showOrder(paid.order);
});
$("#sandbox-confirm").addEventListener("click", async () => {
  const done = await act(orderBox, $("#sandbox-confirm"), () =>
    api("POST", "/billing/crypto/sandbox/confirm", { order_id: current.order_id }));
  if (done) showOrder(done.order);
});


const receiptsList = listGeneration();
async function loadReceipts() {
  const list = receiptsList.restart();
  const receipts = await api("GET", "/billing/receipts?limit=100");
  if (!receiptsList.isCurrent(list)) return;
  const body = $("#receipts-table tbody");
  body.textContent = "";
  $("#receipts-empty").hidden = receipts.length > 0;
  $("#receipts-table").hidden = receipts.length === 0;
  receipts.forEach((r) => {
    const row = el("tr");
    cell(row, r.number + (r.void ? " (void: " + r.void.credit_note + ")" : ""), "path");
    cell(row, when(r.issued_at));
    cell(row, usd.format(r.amount_usd), "num");
    cell(row, number.format(r.credits), "num");
    cell(row, r.currency ? (r.amount_paid ?? "") + " " + r.currency : r.method);
    const pdf = button("PDF", "secondary small", "receipt-pdf");
    pdf.dataset.op = "get /billing/receipts/{number}";
    pdf.addEventListener("click", () => act($("#billing-documents"), pdf, () => downloadPdf(r.number)));
    cell(row, "").append(pdf);
    body.append(row);
  });
  labelCells($("#receipts-table"));
}

// The PDF is asked for by its media type (the same address answers JSON); saved under the receipt's number.
async function downloadPdf(number) {
  const response = await fetch("/billing/receipts/" + encodeURIComponent(number), {
    credentials: "same-origin",
    headers: { Accept: "application/pdf" },
  });
  if (!response.ok) throw new ApiFailure(response.status, "The receipt could not be downloaded (" + response.status + ").");
  const link = el("a");
  link.href = URL.createObjectURL(await response.blob());
  link.download = number + ".pdf";
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 60000);
}

const DETAIL_FIELDS = { legal_name: "#details-legal-name", address: "#details-address", country: "#details-country", tax_id: "#details-tax-id", email: "#details-email" };
async function loadDetails() {
  const details = await api("GET", "/billing/details");
  for (const [name, selector] of Object.entries(DETAIL_FIELDS)) $(selector).value = details[name] || "";
  $("#details-saved").textContent = details.updated_at ? "Last changed " + when(details.updated_at) + "." : "";
}

$("#details-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const body = {};
  for (const [name, selector] of Object.entries(DETAIL_FIELDS)) {
    const value = $(selector).value.trim();
    if (value || name === "legal_name") body[name] = value;
  }
  const saved = await act($("#details-form"), $("#details-submit"), () => api("PUT", "/billing/details", body));
  if (saved) $("#details-saved").textContent = "Saved. Receipts issued from now on carry these details.";
});
