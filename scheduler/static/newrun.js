// The form to submit a run: a registered agent (GET /v1/agents) or an inline JSON spec.

import { agents, runs } from "./api.js";
import { h, replace } from "./dom.js";

const INLINE = "__inline__";
const EXAMPLE = JSON.stringify({ kind: "agent", model: "demo", tools: ["current_time", "calculator"] }, null, 2);

function describe(a) {
  const flags = ["plan", "ask", "guarded"].filter((f) => a[f]);
  return [a.kind, `model ${a.model}`, a.tools.length ? `tools ${a.tools.join(", ")}` : null, flags.join(", ") || null]
    .filter(Boolean).join(" · ");
}

export async function renderNewRun(root, { onSubmitted }) {
  const select = h("select", { id: "agent", "data-testid": "agent-select" });
  const info = h("div", { class: "muted agent-info" });
  const spec = h("textarea", { id: "spec", rows: 8, class: "mono", spellcheck: "false", "data-testid": "spec-input" }, EXAMPLE);
  const specRow = h("label", { class: "field", hidden: true }, h("span", {}, "Agent spec (JSON)"), spec);
  const input = h("textarea", { id: "input", rows: 4, placeholder: "What should the agent do?", "data-testid": "run-input" });
  const error = h("div", { class: "card-error" });
  const submit = h("button", { class: "btn btn-primary", type: "submit", "data-testid": "submit-run" }, "Submit run");
  const form = h("form", { class: "new-run", "data-testid": "new-run-form" },
    h("h1", {}, "New run"),
    h("label", { class: "field" }, h("span", {}, "Agent"), select, info),
    specRow,
    h("label", { class: "field" }, h("span", {}, "Input"), input),
    h("div", { class: "card-actions" }, error, h("span", { class: "spacer" }), submit));
  replace(root, form);

  let list = [];
  try {
    list = await agents();
  } catch (err) {
    error.textContent = err.message;
  }
  replace(select, list.map((a) => h("option", { value: a.name }, a.name)), h("option", { value: INLINE }, "Inline spec (JSON)…"));
  const preferred = list.find((a) => a.name === "demo-assistant") || list[0];
  if (preferred) select.value = preferred.name;
  const sync = () => {
    const a = list.find((x) => x.name === select.value);
    specRow.hidden = select.value !== INLINE;
    info.textContent = a ? describe(a) : "Any agent spec (fields: docs/api.md); unknown fields are rejected.";
  };
  select.addEventListener("change", sync);
  sync();
  input.focus();
  input.addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) form.requestSubmit(); });

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    error.textContent = "";
    let agent = select.value;
    const metadata = { source: "console" };
    if (agent === INLINE) {
      try { agent = JSON.parse(spec.value); } catch (err) { error.textContent = `spec is not JSON: ${err.message}`; return; }
    } else metadata.agent = agent;
    if (!input.value.trim()) { error.textContent = "the input is empty"; return; }
    submit.disabled = true;
    try {
      const run = await runs.submit({ agent, input: input.value, metadata });
      onSubmitted(run);
    } catch (err) {
      error.textContent = err.message;
      submit.disabled = false;
    }
  });
}
