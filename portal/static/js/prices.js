// Prices: what each data endpoint costs under the gateway's running price rules, and how long its answers stay
// fresh in the answer cache (GET /prices, social/prices.py): the same figures the calls are charged by.
import { $, cell, fillTable, number } from "./dom.js";
import { act, api } from "./api.js";

const scope = $("#view-prices");

function seconds(s) {
  if (!s) return "not cached";
  return s % 60 ? number.format(s) + " s" : number.format(s / 60) + " min";
}

export async function loadPrices() {
  const sheet = await act(scope, null, () => api("GET", "/prices"));
  if (!sheet) return;
  const repeat = sheet.cache_hit_price ? number.format(sheet.cache_hit_price * 100) + " % of its price" : "nothing";
  $("#prices-terms").textContent = number.format(sheet.credits_per_usd) + " credits = 1 USD. Every successful call " +
    "costs at least " + number.format(sheet.minimum) + " credits, an empty page too; an error is never charged. " +
    "A repeat of a call while its answer is fresh is answered from the cache and costs " + repeat + ".";
  const rows = sheet.endpoints.filter((e) => e.available);
  fillTable("#prices-table", "#prices-empty", rows, "price-row", (row, e) => {
    cell(row, "/social" + e.endpoint, "path");
    cell(row, e.price);
    cell(row, number.format(e.minimum), "num");
    cell(row, e.full_page === null ? "by ids sent" : number.format(e.full_page), "num");
    cell(row, seconds(e.fresh_seconds), "num");
  });
}
