// The run list (sidebar): status filters, newest first, refreshed every few seconds.

import { runs } from "./api.js";
import { ago, fmtCost, fmtTokens, h, modelName, replace } from "./dom.js";

const FILTERS = ["all", "scheduled", "running", "waiting", "completed", "failed", "cancelled"];
const POLL_MS = 2000;

export class RunList {
  constructor(root) {
    this.root = root;
    this.filter = "all";
    this.selected = null;
    this.error = null;
    this.items = [];
    this.timer = null;
    this.build();
  }

  build() {
    this.chips = h("div", { class: "chips", role: "tablist" },
      FILTERS.map((f) => h("button", {
        class: "chip", type: "button", "data-filter": f, "data-testid": `filter-${f}`,
        onclick: () => this.setFilter(f),
      }, f)));
    this.list = h("div", { class: "run-list", "data-testid": "run-list" });
    this.foot = h("div", { class: "sidebar-foot muted" });
    replace(this.root, h("div", { class: "sidebar-head" }, h("h2", {}, "Runs"), this.chips),
      this.list, this.foot);
    this.paintChips();
  }

  start() {
    this.refresh();
    this.timer = setInterval(() => { if (!document.hidden) this.refresh(); }, POLL_MS);
  }

  setFilter(filter) {
    this.filter = filter;
    this.paintChips();
    this.refresh();
  }

  select(runId) {
    this.selected = runId;
    this.paint();
  }

  paintChips() {
    for (const chip of this.chips.children) {
      chip.classList.toggle("active", chip.dataset.filter === this.filter);
    }
  }

  async refresh() {
    try {
      const page = await runs.list(this.filter === "all" ? null : this.filter);
      this.items = page.runs;
      this.error = null;
    } catch (err) {
      this.error = err;
    }
    this.paint();
  }

  paint() {
    if (this.error) {
      replace(this.list, h("div", { class: "empty error" }, this.error.message));
    } else if (!this.items.length) {
      replace(this.list, h("div", { class: "empty" }, "No runs", this.filter !== "all" ? ` (${this.filter})` : "", "."));
    } else {
      replace(this.list, this.items.map((run) => this.item(run)));
    }
    replace(this.foot, `${this.items.length} shown · refreshed ${new Date().toLocaleTimeString()}`);
  }

  item(run) {
    const u = run.usage || {};
    return h("a", {
      class: `run-item${run.id === this.selected ? " selected" : ""}`,
      href: `#/runs/${run.id}`, "data-testid": "run-item", "data-run-id": run.id,
    },
    h("span", { class: `dot st-${run.status}`, title: run.status }),
    h("div", { class: "ri-main" },
      h("div", { class: "ri-top" },
        h("span", { class: "ri-name" }, modelName(run)),
        h("span", { class: `badge st-${run.status}` }, run.status)),
      h("div", { class: "ri-id mono" }, run.id),
      h("div", { class: "ri-sub" },
        `${run.kind} · r${run.round} · ${fmtTokens(u.input_tokens + u.output_tokens)} tok · ${fmtCost(u.cost)} · ${ago(run.created_at)}`)));
  }
}
