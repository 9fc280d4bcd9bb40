// A tiny DOM builder: h("div", {class: "x", onclick: fn, style: {width: "5%"}}, "text", child).
// Text always goes in as text nodes (never HTML), so run data cannot inject markup.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "style" && typeof value === "object") {
      // through the CSSOM: the Content-Security-Policy refuses inline style attributes
      for (const [prop, v] of Object.entries(value)) el.style.setProperty(prop, String(v));
    }
    else if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "value" || key === "checked" || key === "disabled" || key === "open") {
      el[key] = value;
    } else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

export function fmtTokens(n) {
  n = Number(n || 0);
  return n >= 10000 ? `${(n / 1000).toFixed(1)}k` : n.toLocaleString("en-US");
}

export function fmtCost(c) {
  c = Number(c || 0);
  if (c === 0) return "$0";
  return c < 0.01 ? `$${c.toFixed(6)}` : `$${c.toFixed(4)}`;
}

export function fmtSeconds(s) {
  if (s === null || s === undefined || Number.isNaN(s)) return "";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(1)} s`;
  return `${Math.floor(s / 60)}m ${Math.round(s % 60)}s`;
}

export function ago(iso) {
  const secs = (Date.now() - Date.parse(iso)) / 1000;
  if (secs < 5) return "just now";
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60]]) {
    if (secs >= size) return `${Math.floor(secs / size)}${unit} ago`;
  }
  return `${Math.floor(secs)}s ago`;
}

export function prettyJson(text) {
  try {
    return JSON.stringify(typeof text === "string" ? JSON.parse(text || "{}") : text, null, 2);
  } catch {
    return String(text);
  }
}

export function modelName(run) {
  const meta = run.metadata || {};
  if (meta.agent) return meta.agent;
  const model = (run.agent || {}).model;
  if (typeof model === "string") return model;
  if (!model) return "inline";
  return model.name && model.name !== "inline" ? model.name : model.model || "inline";
}
