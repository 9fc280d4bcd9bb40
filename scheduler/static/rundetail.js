// One run: header, timeline (rounds with reasoning, answer text, tool cards), the pause card
// (an ask with clickable options and free text, or an approval checklist), plan board,
// usage and the run's reads and writes of long-term memory. Live over SSE: deltas stream into the current round; every durable event triggers
// a (debounced) refresh of the stored state, which wins once a round is committed.

import { eventsUrl, runs } from "./api.js";
import { ago, fmtCost, fmtSeconds, fmtTokens, h, modelName, prettyJson, replace } from "./dom.js";

const FINAL = new Set(["completed", "failed", "cancelled"]);
const TERMINAL = new Set(["run.completed", "run.failed", "run.cancelled"]);
const RESUMABLE = new Set(["failed", "cancelled"]); // POST /v1/runs/{id}/resume takes them up
const MEMORY = ["memory.read", "memory.written"]; // shared.vocab.MEMORY_EVENTS
const DURABLE = ["run.queued", "round.started", "tool.started", "tool.finished", "plan.updated",
  "run.waiting", "run.resumed", "provider.waiting", "provider.retrying", "message.added", ...MEMORY,
  ...TERMINAL];
const HIDDEN_TOOLS = new Set(["ask_user", "set_plan", "update_plan", "stop"]);
const DECLINED = "Declined by user"; // shared.engine.commands.DECLINED_TEXT
const PLAN_MARK = { done: "✓", in_progress: "▸", blocked: "✕", skipped: "–", pending: "○" };

function textOf(content) {
  if (Array.isArray(content)) return content.map((p) => p.text || "").join(" ");
  return content ? String(content) : "";
}

function epoch(iso) {
  return Date.parse(iso) / 1000;
}

export class RunDetail {
  constructor(root, runId, { onChanged } = {}) {
    this.root = root;
    this.runId = runId;
    this.onChanged = onChanged;
    this.run = null;
    this.messages = [];
    this.calls = [];
    this.usage = [];
    this.memory = [];
    this.liveText = new Map();
    this.liveReasoning = new Map();
    this.started = new Map();
    this.progress = new Map(); // call_id -> its latest tool.progress (live only)
    this.currentRound = 0;
    this.reasoningOpen = new Map();
    this.pauseKey = null;
    this.es = null;
    this.live = false;
    this.refreshTimer = null;
    this.renderQueued = false;
    this.stopped = false;
  }

  async start() {
    this.buildShell();
    try {
      await this.refresh();
    } catch (err) {
      replace(this.root, h("div", { class: "empty error" }, err.message));
      return;
    }
    this.connect();
    this.ticker = setInterval(() => { if (this.run && !FINAL.has(this.run.status)) this.queueRender(); }, 500);
  }

  stop() {
    this.stopped = true;
    if (this.es) this.es.close();
    clearInterval(this.ticker);
    clearTimeout(this.refreshTimer);
  }

  // -- data

  async refresh() {
    const id = this.runId;
    const [run, messages, calls, usage, memory] = await Promise.all([
      runs.get(id), runs.messages(id), runs.toolCalls(id), runs.usage(id), runs.memory(id)]);
    if (this.stopped) return;
    Object.assign(this, { run, messages, calls, usage, memory });
    for (const m of messages) {
      if (m.role === "assistant") { this.liveText.delete(m.round); this.liveReasoning.delete(m.round); }
    }
    for (const c of calls) {
      this.started.delete(c.call_id);
      if (c.status === "done") this.progress.delete(c.call_id);
    }
    this.currentRound = Math.max(this.currentRound, run.round);
    if (FINAL.has(run.status) && this.es) {
      this.es.close();
      this.es = null;
      this.setLive("");
    }
    this.render();
    if (this.onChanged) this.onChanged(run);
  }

  scheduleRefresh(delay) {
    clearTimeout(this.refreshTimer);
    this.refreshTimer = setTimeout(() => this.refresh().catch((err) => this.flash(err.message)), delay);
  }

  connect() {
    if (this.run && FINAL.has(this.run.status)) return;
    const es = new EventSource(eventsUrl(this.runId));
    this.es = es;
    for (const type of DURABLE) {
      es.addEventListener(type, (e) => this.onDurable(type, JSON.parse(e.data)));
    }
    for (const type of ["text.delta", "reasoning.delta"]) {
      es.addEventListener(type, (e) => this.onDelta(type, JSON.parse(e.data)));
    }
    es.addEventListener("tool.progress", (e) => this.onProgress(JSON.parse(e.data)));
    es.onopen = () => this.setLive("live");
    es.onerror = () => {
      if (es.readyState === EventSource.CLOSED) {
        this.setLive("");
        this.scheduleRefresh(0);
      } else this.setLive("reconnecting");
    };
  }

  onDurable(type, ev) {
    const d = ev.data || {};
    if (type === "round.started") {
      this.currentRound = Math.max(this.currentRound, d.round || 0);
      this.liveText.delete(d.round); // a retried round streams again from the start
      this.liveReasoning.delete(d.round);
    } else if (type === "tool.started" && !this.calls.some((c) => c.call_id === d.call_id)) {
      this.started.set(d.call_id, { call_id: d.call_id, name: d.name, round: d.round, status: "running", started_at: ev.ts ? epoch(ev.ts) : null, arguments: "" });
    }
    // a terminal event ends the stream once the run is still over when read (a resumed run
    // replays its old one, then goes on): refresh() closes it
    const now = TERMINAL.has(type) || type === "run.waiting" || type === "provider.waiting";
    this.scheduleRefresh(now ? 0 : 120);
    this.queueRender();
  }

  onDelta(type, d) {
    const buf = type === "text.delta" ? this.liveText : this.liveReasoning;
    const n = d.round || this.currentRound;
    if (this.messages.some((m) => m.role === "assistant" && m.round === n)) return;
    buf.set(n, (buf.get(n) || "") + (d.text || ""));
    this.currentRound = Math.max(this.currentRound, n);
    this.queueRender();
  }

  onProgress(d) {
    const prev = this.progress.get(d.call_id);
    if (prev && prev.seq >= d.seq) return;
    this.progress.set(d.call_id, d);
    this.queueRender();
  }

  rounds() {
    const views = new Map();
    const at = (n) => {
      if (!views.has(n)) views.set(n, { n, reasoning: "", text: "", streaming: false, tools: [], asks: [], usage: null });
      return views.get(n);
    };
    for (const m of this.messages) {
      if (m.role !== "assistant" || m.kind) continue;
      const v = at(m.round);
      v.reasoning += m.reasoning || "";
      v.text += textOf(m.content);
    }
    for (const n of new Set([...this.liveText.keys(), ...this.liveReasoning.keys()])) {
      const v = at(n);
      Object.assign(v, { reasoning: this.liveReasoning.get(n) || "", text: this.liveText.get(n) || "", streaming: true });
    }
    for (const c of [...this.calls, ...this.started.values()]) {
      if (c.name === "ask_user") at(c.round).asks.push(c);
      else if (!HIDDEN_TOOLS.has(c.name)) at(c.round || this.currentRound).tools.push(c);
    }
    for (const u of this.usage) {
      if ((u.purpose || "round") !== "round") continue;
      const v = at(u.round);
      const sum = v.usage || { input_tokens: 0, output_tokens: 0, cost: 0, latency_ms: 0, estimated: false };
      v.usage = {
        input_tokens: sum.input_tokens + u.input_tokens, output_tokens: sum.output_tokens + u.output_tokens,
        cost: sum.cost + u.cost, latency_ms: sum.latency_ms + (u.latency_ms || 0), estimated: sum.estimated || u.estimated,
        model: u.model,
      };
    }
    if (this.run && !FINAL.has(this.run.status) && this.run.status !== "waiting" && this.currentRound) at(this.currentRound);
    return [...views.values()].sort((a, b) => a.n - b.n);
  }

  // -- rendering

  buildShell() {
    this.head = h("header", { class: "run-head" });
    this.timeline = h("div", { class: "timeline", "data-testid": "timeline" });
    this.pause = h("div", { class: "pause-slot" });
    this.footer = h("div", { class: "run-foot" });
    this.side = h("aside", { class: "run-side" });
    this.toast = h("div", { class: "toast", hidden: true });
    replace(this.root, h("section", { class: "detail", "data-testid": "run-detail", "data-run-id": this.runId },
      h("div", { class: "head-wrap" }, this.head),
      h("div", { class: "detail-body" },
        h("div", { class: "detail-main" }, this.timeline, this.pause, this.footer),
        this.side),
      this.toast));
  }

  queueRender() {
    if (this.renderQueued) return;
    this.renderQueued = true;
    requestAnimationFrame(() => {
      this.renderQueued = false;
      if (!this.stopped && this.run) this.render();
    });
  }

  render() {
    const scroller = this.root.closest(".main") || document.scrollingElement;
    const atBottom = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 120;
    this.renderHead();
    this.renderTimeline();
    this.renderPause();
    this.renderFoot();
    this.renderSide();
    if (atBottom && !FINAL.has(this.run.status)) scroller.scrollTop = scroller.scrollHeight;
  }

  setLive(state) {
    this.live = state;
    const el = this.head.querySelector(".live");
    if (el) { el.textContent = state || ""; el.className = `live ${state ? `is-${state}` : ""}`; }
  }

  flash(message) {
    this.toast.textContent = message;
    this.toast.hidden = false;
    clearTimeout(this.toastTimer);
    this.toastTimer = setTimeout(() => { this.toast.hidden = true; }, 6000);
  }

  renderHead() {
    const run = this.run;
    const u = run.usage;
    const end = FINAL.has(run.status) ? epoch(run.updated_at) : Date.now() / 1000;
    const facts = [
      ["agent", modelName(run)], ["kind", run.kind], ["round", Math.max(run.round, this.currentRound)],
      ["tokens", `${fmtTokens(u.input_tokens)} → ${fmtTokens(u.output_tokens)}`],
      ["cost", fmtCost(u.cost)], ["time", fmtSeconds(end - epoch(run.created_at))],
    ];
    replace(this.head,
      h("div", { class: "rh-top" },
        h("span", { class: `badge big st-${run.status}`, "data-testid": "run-status" }, run.status),
        h("h1", { class: "mono run-id", title: "run id" }, run.id),
        h("span", { class: `live ${this.live ? `is-${this.live}` : ""}` }, this.live || ""),
        h("span", { class: "spacer" }),
        FINAL.has(run.status) ? (RESUMABLE.has(run.status) ? this.resumeButton() : null) : this.cancelButton()),
      h("dl", { class: "facts" }, facts.map(([k, v]) => h("div", { class: "fact" }, h("dt", {}, k), h("dd", { "data-fact": k }, String(v))))),
      (run.warnings || []).length
        ? h("ul", { class: "run-warnings", "data-testid": "run-warnings" }, run.warnings.map((w) => h("li", {}, w)))
        : null);
  }

  cancelButton() {
    const btn = h("button", { class: "btn btn-danger-ghost", type: "button", "data-testid": "cancel-run" }, "Cancel run");
    btn.addEventListener("click", async () => {
      if (!btn.classList.contains("confirm")) {
        btn.classList.add("confirm");
        btn.textContent = "Confirm cancel";
        setTimeout(() => { btn.classList.remove("confirm"); btn.textContent = "Cancel run"; }, 3000);
        return;
      }
      btn.disabled = true;
      try { await runs.cancel(this.runId); } catch (err) { this.flash(err.message); }
      this.scheduleRefresh(0);
    });
    return btn;
  }

  resumeButton() {
    const btn = h("button", { class: "btn btn-primary", type: "button", "data-testid": "resume-run" }, "Resume run");
    btn.addEventListener("click", async () => {
      btn.disabled = true;
      try {
        await runs.resume(this.runId);
        await this.refresh();
        this.connect(); // the run goes on: follow it again
      } catch (err) { this.flash(err.message); btn.disabled = false; }
    });
    return btn;
  }

  renderTimeline() {
    const first = this.messages.find((m) => m.role === "user" && !m.hidden);
    replace(this.timeline,
      first ? h("div", { class: "msg-user" }, h("div", { class: "label" }, "input"), h("div", { class: "text" }, textOf(first.content))) : null,
      this.rounds().map((v) => this.roundCard(v)));
  }

  roundCard(v) {
    const u = v.usage;
    const meta = u
      ? `${fmtTokens(u.input_tokens)} → ${fmtTokens(u.output_tokens)} tok${u.estimated ? " (est.)" : ""} · ${fmtCost(u.cost)} · ${fmtSeconds(u.latency_ms / 1000)}`
      : v.streaming ? "streaming…" : "thinking…";
    const thinking = !v.text && !v.reasoning && !v.tools.length && !v.asks.length && !u;
    return h("article", { class: `round${v.streaming ? " streaming" : ""}`, "data-testid": "round", "data-round": v.n },
      h("header", { class: "round-head" },
        h("span", { class: "round-n" }, `Round ${v.n}`),
        h("span", { class: "round-meta mono", "data-testid": "round-usage" }, meta)),
      v.reasoning ? this.reasoningBlock(v) : null,
      v.text ? h("div", { class: `answer${v.streaming ? " typing" : ""}`, "data-testid": v.streaming ? "live-text" : "answer-text" }, v.text) : null,
      thinking ? h("div", { class: "thinking" }, h("span", { class: "spinner" }), "waiting for the model") : null,
      v.asks.map((c) => this.askRecord(c)),
      v.tools.map((c) => this.toolCard(c)));
  }

  reasoningBlock(v) {
    const open = this.reasoningOpen.has(v.n) ? this.reasoningOpen.get(v.n) : v.streaming || v.reasoning.length <= 280;
    const summary = h("summary", {}, v.streaming ? "Reasoning (streaming)" : "Reasoning",
      h("span", { class: "muted" }, ` · ${v.reasoning.length} chars`));
    const det = h("details", { class: "reasoning", open }, summary, h("div", { class: "reasoning-text" }, v.reasoning));
    summary.addEventListener("click", () => this.reasoningOpen.set(v.n, !det.open));
    return det;
  }

  askRecord(c) {
    let questions = [];
    try { questions = JSON.parse(c.arguments || "{}").questions || []; } catch { /* shown raw */ }
    const answers = (c.result || "").split(/^## /m).filter(Boolean).map((block) => {
      const [question, ...rest] = block.split("\n");
      return [question.trim(), rest.join("\n").replace(/^Answer:\s*/m, "").trim()];
    });
    const done = c.status === "done" && answers.length;
    return h("div", { class: "ask-record" },
      h("span", { class: "tag" }, done ? "you answered" : "asked you"),
      done
        ? h("dl", { class: "qa" }, answers.map(([q, a]) => [h("dt", {}, q), h("dd", {}, a)]))
        : h("span", {}, questions.map((q) => q.question).join(" · "), h("span", { class: "muted" }, " · waiting for the answer")));
  }

  toolCard(c) {
    const now = Date.now() / 1000;
    const running = c.status === "running" || c.status === "queued";
    const since = (t) => (typeof t === "string" ? epoch(t) : t);  // API rows: ISO; live: epoch
    const secs = c.started_at ? (c.finished_at ? since(c.finished_at) : now) - since(c.started_at) : null;
    const declined = c.status === "done" && (c.result || "").startsWith(DECLINED);
    const state = c.status === "done" ? (c.error ? "error" : declined ? "declined" : "ok") : c.status;
    const icon = running ? h("span", { class: "spinner" }) : h("span", { class: `ti ti-${state}` }, { ok: "✓", error: "✕", declined: "⊘", waiting: "●", pending: "…" }[state] || "•");
    const args = c.arguments ? prettyJson(c.arguments) : "";
    const result = c.error || c.result || "";
    const p = running ? this.progress.get(c.call_id) : null;
    const pct = p && p.total ? ` ${Math.round((100 * (p.progress || 0)) / p.total)}%` : p && p.progress != null ? ` ${p.progress}` : "";
    return h("div", { class: `tool tool-${state}`, "data-testid": "tool-card", "data-tool": c.name },
      h("div", { class: "tool-head" }, icon,
        h("span", { class: "tool-name mono" }, c.name),
        h("span", { class: "tool-status" }, c.status === "waiting" ? "needs approval" : declined ? "declined" : c.status),
        h("span", { class: "spacer" }),
        c.decision ? h("span", { class: "muted tool-decision", "data-testid": "tool-decision", title: c.decision.at || "" },
          `${{ approve: "approved", edit: "edited", reject: "declined" }[c.decision.action] || c.decision.action}${c.decision.by ? ` by ${c.decision.by}` : ""}`) : null,
        c.attempts > 1 ? h("span", { class: "muted" }, `${c.attempts} attempts`) : null,
        c.cost ? h("span", { class: "muted mono" }, fmtCost(c.cost)) : null,
        h("span", { class: "muted mono" }, fmtSeconds(secs))),
      p ? h("div", { class: "tool-progress muted", "data-testid": "tool-progress" }, `${p.message || ""}${pct}`.trim()) : null,
      args && args !== "{}" && c.status !== "waiting" ? h("pre", { class: "args" }, args) : null, // waiting: the approval card shows them
      c.decision && c.decision.action === "edit" ? h("details", { class: "result", "data-testid": "tool-proposed" },
        h("summary", {}, "proposed by the model"), h("pre", {}, prettyJson(c.decision.proposed_arguments))) : null,
      result ? h("details", { class: "result", open: result.length < 400 },
        h("summary", {}, c.error ? "error" : "result", h("span", { class: "muted" }, ` · ${result.length} chars`)),
        h("pre", {}, result)) : null);
  }

  renderPause() {
    const p = this.run.status === "waiting" ? this.run.pending : null;
    const key = p ? `${p.kind}:${p.ask_id || p.approval_id || p.retry_at}` : null;
    if (key === this.pauseKey) return;
    this.pauseKey = key;
    if (!p) { replace(this.pause); return; }
    const card = { ask: () => this.askCard(p), provider: () => this.providerCard(p) }[p.kind];
    replace(this.pause, card ? card() : this.approvalCard(p));
  }

  providerCard(p) {
    const at = new Date(p.retry_at).toLocaleTimeString();  // ISO 8601, as every API time
    return h("section", { class: "pause-card", "data-testid": "provider-card" },
      h("header", {}, h("span", { class: "tag tag-wait" }, "provider"),
        h("strong", {}, `Waiting for the model provider ${p.profile}`)),
      h("div", { class: "muted" }, `Try ${p.tries + 1} at ${at} (first failed ${ago(p.since)}); the run holds no worker meanwhile.`),
      p.error ? h("pre", { class: "args" }, p.error) : null);
  }

  askCard(p) {
    const picks = p.questions.map(() => null);
    const texts = p.questions.map(() => "");
    const error = h("div", { class: "card-error" });
    const send = h("button", { class: "btn btn-primary", type: "button", "data-testid": "ask-send", disabled: true }, "Send answer");
    const ready = () => p.questions.every((_, i) => picks[i] !== null || texts[i].trim());
    const questions = p.questions.map((q, qi) => {
      const free = h("input", { class: "free", type: "text", placeholder: "…or type your own answer", "data-testid": "ask-free" });
      const options = q.options.map((o) => h("button", {
        class: "option", type: "button", "data-testid": "ask-option", "data-value": o.value,
        onclick: () => { picks[qi] = o.value; texts[qi] = ""; free.value = ""; paint(); },
      }, h("span", { class: "opt-label" }, o.label), o.value !== o.label ? h("span", { class: "opt-value mono" }, o.value) : null));
      const paint = () => {
        options.forEach((b) => b.classList.toggle("picked", b.dataset.value === picks[qi] && !texts[qi]));
        send.disabled = !ready();
      };
      free.addEventListener("input", () => { texts[qi] = free.value; if (free.value) picks[qi] = null; paint(); });
      free.addEventListener("keydown", (e) => { if (e.key === "Enter" && !send.disabled) send.click(); });
      return h("fieldset", { class: "question" }, h("legend", {}, q.question), h("div", { class: "options" }, options), free);
    });
    send.addEventListener("click", async () => {
      send.disabled = true;
      const answers = p.questions.map((_, i) => texts[i].trim() || picks[i]);
      try {
        await runs.answer(this.runId, p.ask_id, answers);
        send.textContent = "Sent";
        this.scheduleRefresh(0);
      } catch (err) {
        error.textContent = err.message;
        send.disabled = false;
      }
    });
    return h("section", { class: "pause-card ask", "data-testid": "ask-card" },
      h("header", {}, h("span", { class: "tag tag-wait" }, "question"), h("strong", {}, "The agent needs your answer")),
      p.reason ? h("p", { class: "reason" }, p.reason) : null,
      questions, h("div", { class: "card-actions" }, error, h("span", { class: "spacer" }), send));
  }

  approvalCard(p) {
    // per item: Approve, Edit (approve with the arguments in the box, checked by the server
    // against the tool's schema) or Reject (with an optional message the model reads)
    const decision = new Map();
    const error = h("div", { class: "card-error" });
    const note = h("input", { class: "free", type: "text", placeholder: "note for the model (optional)", "data-testid": "approval-note" });
    const submit = h("button", { class: "btn btn-primary", type: "button", "data-testid": "approval-submit", disabled: true }, "Submit decision");
    const rows = p.items.map((item) => {
      const yes = h("button", { class: "seg-btn yes", type: "button", "data-testid": "approve-item" }, "Approve");
      const edit = h("button", { class: "seg-btn ed", type: "button", "data-testid": "edit-item" }, "Edit");
      const no = h("button", { class: "seg-btn no", type: "button", "data-testid": "reject-item" }, "Reject");
      const proposed = prettyJson(item.arguments);
      const box = h("textarea", { class: "edit-args mono", rows: Math.min(12, proposed.split("\n").length + 1), "data-testid": "edit-args", spellcheck: "false", "aria-label": `arguments for ${item.tool}` });
      box.value = proposed;
      box.addEventListener("input", () => { error.textContent = ""; });
      const why = h("input", { class: "free reject-message", type: "text", maxlength: 4000, placeholder: "why (optional): the model reads “Declined by user: …”", "data-testid": "reject-message" });
      const row = h("div", { class: "approval-item", "data-testid": "approval-item", "data-call-id": item.call_id },
        h("div", { class: "ai-head" },
          h("span", { class: "tool-name mono" }, item.tool),
          h("span", { class: "muted mono" }, item.call_id),
          h("span", { class: "spacer" }),
          h("div", { class: "seg" }, yes, edit, no)),
        h("pre", { class: "args" }, proposed), box, why);
      const set = (d) => { decision.set(item.call_id, d); paint(); if (d === "edit") box.focus(); if (d === "reject") why.focus(); };
      yes.addEventListener("click", () => set("approve"));
      edit.addEventListener("click", () => set("edit"));
      no.addEventListener("click", () => set("reject"));
      row.paint = () => {
        const d = decision.get(item.call_id);
        yes.classList.toggle("on", d === "approve");
        edit.classList.toggle("on", d === "edit");
        no.classList.toggle("on", d === "reject");
        box.hidden = d !== "edit";
        why.hidden = d !== "reject";
        row.dataset.decision = d || "";
      };
      row.decided = () => {
        const d = decision.get(item.call_id);
        if (d === "reject") return { call_id: item.call_id, action: "reject", message: why.value.trim() || null };
        if (d !== "edit") return { call_id: item.call_id, action: "approve" };
        let args;
        try {
          args = JSON.parse(box.value);
        } catch (err) {
          throw new Error(`${item.call_id}: the edited arguments are not JSON (${err.message})`);
        }
        if (args === null || typeof args !== "object" || Array.isArray(args)) throw new Error(`${item.call_id}: the edited arguments must be a JSON object`);
        return { call_id: item.call_id, action: "edit", arguments: args };
      };
      return row;
    });
    const count = (d) => [...decision.values()].filter((x) => x === d).length;
    const paint = () => {
      rows.forEach((r) => r.paint());
      submit.disabled = decision.size < p.items.length;
      const edits = count("edit") ? `, ${count("edit")} edit` : "";
      submit.textContent = decision.size < p.items.length
        ? `Decide ${p.items.length - decision.size} more`
        : `Submit: ${count("approve")} approve${edits}, ${count("reject")} reject`;
    };
    const all = (d) => { p.items.forEach((i) => decision.set(i.call_id, d)); paint(); };
    submit.addEventListener("click", async () => {
      submit.disabled = true;
      error.textContent = "";
      try {
        const decisions = rows.map((r) => r.decided());
        await runs.approve(this.runId, { approval_id: p.approval_id, decisions, note: note.value || null });
        submit.textContent = "Submitted";
        this.scheduleRefresh(0);
      } catch (err) {
        error.textContent = err.message;
        submit.disabled = false;
      }
    });
    paint();
    return h("section", { class: "pause-card approval", "data-testid": "approval-card" },
      h("header", {}, h("span", { class: "tag tag-wait" }, "approval"),
        h("strong", {}, `${p.items.length} write${p.items.length > 1 ? "s" : ""} need${p.items.length > 1 ? "" : "s"} your approval`),
        h("span", { class: "spacer" }),
        h("button", { class: "btn btn-ghost small", type: "button", onclick: () => all("approve") }, "Approve all"),
        h("button", { class: "btn btn-ghost small", type: "button", onclick: () => all("reject") }, "Reject all")),
      rows, note, h("div", { class: "card-actions" }, error, h("span", { class: "spacer" }), submit));
  }

  renderFoot() {
    const run = this.run;
    if (run.status === "failed" && run.error) {
      replace(this.footer, h("div", { class: "final final-failed", "data-testid": "run-final" },
        h("strong", {}, `Failed: ${run.error.code}`), h("pre", {}, run.error.message)));
    } else if (FINAL.has(run.status)) {
      replace(this.footer, h("div", { class: `final final-${run.status}`, "data-testid": "run-final" },
        h("strong", {}, run.status === "completed" ? "Completed" : "Cancelled"),
        h("span", { class: "muted" }, ` · stop reason ${run.stop_reason || "–"} · ${run.round} round${run.round === 1 ? "" : "s"}`)));
    } else replace(this.footer);
  }

  renderSide() {
    const run = this.run;
    const agent = run.agent || {};
    const tools = (agent.tools || []).map((t) => (typeof t === "string" ? t : t.name));
    const flags = ["plan", "ask", "guarded"].filter((f) => agent[f]);
    replace(this.side,
      run.plan ? this.planBoard(run.plan) : null,
      h("section", { class: "side-card" }, h("h3", {}, "Usage"), this.usageTable()),
      this.memory.length ? this.memoryCard() : null,
      h("section", { class: "side-card" }, h("h3", {}, "Agent"),
        h("dl", { class: "kv" },
          h("dt", {}, "kind"), h("dd", {}, agent.kind || run.kind),
          h("dt", {}, "model"), h("dd", { class: "mono" }, modelName({ agent })),
          h("dt", {}, "tools"), h("dd", { class: "mono" }, tools.join(", ") || "—"),
          h("dt", {}, "flags"), h("dd", {}, flags.join(", ") || "—"),
          h("dt", {}, "created"), h("dd", { title: run.created_at }, ago(run.created_at)),
          run.thread_id ? [h("dt", {}, "thread"), h("dd", { class: "mono" }, run.thread_id)] : null),
        agent.system_prompt ? h("details", { class: "sys" }, h("summary", {}, "system prompt"), h("pre", {}, agent.system_prompt)) : null));
  }

  planBoard(plan) {
    const steps = plan.steps || [];
    const done = steps.filter((s) => s.status === "done" || s.status === "skipped").length;
    return h("section", { class: "side-card plan", "data-testid": "plan-board" },
      h("h3", {}, "Plan", h("span", { class: "muted" }, ` · ${done}/${steps.length}`)),
      h("div", { class: "plan-name" }, plan.name),
      h("div", { class: "progress" }, h("div", { class: "bar", style: { width: `${steps.length ? (100 * done) / steps.length : 0}%` } })),
      h("ol", { class: "steps" }, steps.map((s) => h("li", { class: `step step-${s.status}`, "data-status": s.status },
        h("span", { class: "step-mark" }, PLAN_MARK[s.status] || "○"),
        h("span", { class: "step-name" }, s.name),
        s.note ? h("span", { class: "step-note muted" }, s.note) : null))));
  }

  memoryCard() {
    // each memory.written / memory.read event of the run: the namespace, and the key written
    // or the query and the keys it found
    return h("section", { class: "side-card memory", "data-testid": "memory-card" },
      h("h3", {}, "Memory", h("span", { class: "muted" }, ` · ${this.memory.length}`)),
      h("ol", { class: "memory-events" }, this.memory.map((e) => {
        const d = e.data || {};
        const ns = (d.namespace || []).join(" / ");
        const wrote = e.type === "memory.written";
        return h("li", { class: `memory-event ${wrote ? "wrote" : "read"}`, "data-type": e.type, title: e.ts },
          h("span", { class: "memory-kind" }, wrote ? "wrote" : "read"),
          h("span", { class: "mono memory-ns" }, ns),
          wrote
            ? h("span", { class: "memory-what" }, h("code", {}, d.key), d.preview ? ` ${d.preview}` : "")
            : h("span", { class: "memory-what" }, `“${d.query || ""}” → ${d.count || 0}`,
              (d.keys || []).length ? h("code", {}, ` ${(d.keys || []).join(", ")}`) : ""));
      })));
  }

  usageTable() {
    const rows = this.rounds().filter((v) => v.usage);
    const u = this.run.usage;
    const latency = rows.reduce((sum, v) => sum + v.usage.latency_ms, 0);
    return h("table", { class: "usage" },
      h("thead", {}, h("tr", {}, ["round", "in", "out", "cost", "time"].map((c) => h("th", {}, c)))),
      h("tbody", {}, rows.map((v) => h("tr", {},
        h("td", {}, v.n), h("td", {}, fmtTokens(v.usage.input_tokens)), h("td", {}, fmtTokens(v.usage.output_tokens)),
        h("td", {}, fmtCost(v.usage.cost)), h("td", {}, fmtSeconds(v.usage.latency_ms / 1000))))),
      h("tfoot", {}, h("tr", {}, h("td", {}, "total"), h("td", {}, fmtTokens(u.input_tokens)),
        h("td", {}, fmtTokens(u.output_tokens)), h("td", {}, fmtCost(u.cost)), h("td", {}, fmtSeconds(latency / 1000)))));
  }
}
