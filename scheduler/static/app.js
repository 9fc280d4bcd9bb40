// The console: hash routes #/ (runs), #/runs/<id> (a run), #/new (submit). The run list stays
// in the sidebar; the main pane shows the route.

import { adoptKeyFromUrl, getKey, setKey } from "./api.js";
import { h, replace } from "./dom.js";
import { renderNewRun } from "./newrun.js";
import { RunDetail } from "./rundetail.js";
import { RunList } from "./runlist.js";
import { spendPanel } from "./spend.js";

const main = document.getElementById("main");
let detail = null;
let list = null;

function route() {
  if (detail) { detail.stop(); detail = null; }
  main.scrollTop = 0;
  const hash = window.location.hash || "#/";
  const match = hash.match(/^#\/runs\/([\w-]+)/);
  list.select(match ? match[1] : null);
  if (match) {
    detail = new RunDetail(main, match[1], { onChanged: () => list.refresh() });
    detail.start();
  } else if (hash.startsWith("#/new")) {
    renderNewRun(main, { onSubmitted: (run) => { window.location.hash = `#/runs/${run.id}`; list.refresh(); } });
  } else {
    const welcome = h("div", { class: "welcome" },
      h("h1", {}, "Runs"),
      h("p", { class: "muted" }, "Pick a run on the left to follow it live, or start one."),
      h("a", { class: "btn btn-primary", href: "#/new" }, "New run"),
      h("pre", { class: "hint mono" }, "treadle submit 'Please save a note' -a demo-assistant --watch"));
    replace(main, welcome);
    spendPanel().then((panel) => { if (welcome.isConnected) welcome.append(panel); });
  }
}

function keyBar() {
  const bar = document.getElementById("keybar");
  const input = document.getElementById("key-input");
  const button = document.getElementById("key-button");
  const paint = () => { button.textContent = getKey() ? "Key ✓" : "Key"; };
  button.addEventListener("click", () => { bar.hidden = !bar.hidden; input.value = getKey(); if (!bar.hidden) input.focus(); });
  document.getElementById("key-save").addEventListener("click", () => { setKey(input.value.trim()); bar.hidden = true; paint(); route(); });
  document.getElementById("key-clear").addEventListener("click", () => { setKey(""); input.value = ""; paint(); route(); });
  paint();
}

function theme() {
  const modes = ["auto", "light", "dark"];
  const button = document.getElementById("theme-button");
  const apply = (mode) => {
    document.documentElement.dataset.theme = mode;
    button.title = `Theme: ${mode}`;
    localStorage.setItem("treadle.theme", mode);
  };
  apply(localStorage.getItem("treadle.theme") || "auto");
  button.addEventListener("click", () => apply(modes[(modes.indexOf(document.documentElement.dataset.theme) + 1) % 3]));
}

async function health() {
  const el = document.getElementById("conn");
  try {
    const r = await fetch("/healthz");
    el.className = `conn ${r.ok ? "ok" : "degraded"}`;
    el.title = r.ok ? "API reachable" : "API degraded";
  } catch {
    el.className = "conn down";
    el.title = "API unreachable";
  }
}

adoptKeyFromUrl();
theme();
keyBar();
list = new RunList(document.getElementById("sidebar"));
list.start();
window.addEventListener("hashchange", route);
route();
health();
setInterval(health, 10000);

