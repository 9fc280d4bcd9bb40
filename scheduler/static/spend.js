// The spend panel of the console's home: the tenant's spend envelopes (docs/cost.md), each
// with what is spent and reserved by calls in flight in its current period.

import { spend } from "./api.js";
import { fmtCost, h } from "./dom.js";

function row(e) {
  const used = e.cap > 0 ? Math.min(1, (e.spent + e.reserved) / e.cap) : 1;
  return h("tr", { "data-testid": e.key ? `spend-${e.scope}-${e.key}` : `spend-${e.scope}` },
    h("td", {}, e.scope), h("td", { class: "mono" }, e.key || "—"), h("td", {}, e.period),
    h("td", {}, fmtCost(e.spent)), h("td", {}, fmtCost(e.reserved)), h("td", {}, fmtCost(e.cap)),
    h("td", {}, h("meter", { min: "0", max: "1", value: String(used) })),
    h("td", { class: "muted" }, e.on_exceed));
}

export async function spendPanel() {
  let envelopes = [];
  try {
    envelopes = (await spend()) || [];
  } catch (err) {
    return h("section", { class: "card spend", "data-testid": "spend" },
      h("h2", {}, "Spend"), h("p", { class: "muted" }, `spend envelopes unavailable: ${err.message}`));
  }
  const body = envelopes.length
    ? h("table", { class: "table" },
        h("thead", {}, h("tr", {}, ...["scope", "key", "period", "spent", "reserved", "cap", "", "at the cap"].map((t) => h("th", {}, t)))),
        h("tbody", {}, ...envelopes.map(row)))
    : h("p", { class: "muted" }, "No spend envelopes: treadle spend set tenant --cap 5 --period month");
  return h("section", { class: "card spend", "data-testid": "spend" }, h("h2", {}, "Spend"), body);
}
