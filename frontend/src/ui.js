// Small helpers to build the page: elements, tables, forms, numbers people can read.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function table(columns, rows, { empty = "Nothing yet.", caption } = {}) {
  if (!rows.length) return el("p", { class: "muted" }, empty);
  return el(
    "table",
    {},
    caption ? el("caption", {}, caption) : null,
    el("thead", {}, el("tr", {}, columns.map((c) => el("th", { scope: "col" }, c.label)))),
    el(
      "tbody",
      {},
      rows.map((row) => el("tr", {}, columns.map((c) => el("td", {}, c.value(row))))),
    ),
  );
}

export function badge(text, kind = text) {
  return el("span", { class: `badge badge-${String(kind).replace(/[^a-z_-]/gi, "")}` }, text);
}

export function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = Number(n);
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(unit ? 1 : 0)} ${units[unit]}`;
}

export function ago(iso) {
  if (!iso) return "never";
  const seconds = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
  if (seconds < 60) return `${Math.round(seconds)} s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)} h ago`;
  return new Date(iso).toLocaleString();
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

/** A labelled field; errors for it are shown beside it (see showErrors). */
export function field(label, input, help) {
  const id = input.id || `f-${input.name}`;
  input.id = id;
  const error = el("p", { class: "field-error", id: `${id}-error`, role: "alert" });
  input.setAttribute("aria-describedby", `${id}-error`);
  return el(
    "div",
    { class: "field", "data-field": input.name },
    el("label", { for: id }, label),
    input,
    help ? el("p", { class: "help" }, help) : null,
    error,
  );
}

/** Show an API error: each field's message beside the field, the rest on top. */
export function showErrors(form, error) {
  for (const node of form.querySelectorAll(".field-error")) node.textContent = "";
  for (const node of form.querySelectorAll("[aria-invalid]")) node.removeAttribute("aria-invalid");
  const rest = [];
  for (const [name, messages] of Object.entries(error.details || {})) {
    const holder = form.querySelector(`[data-field="${name}"]`);
    const text = Array.isArray(messages) ? messages.join(" ") : JSON.stringify(messages);
    if (holder) {
      holder.querySelector(".field-error").textContent = text;
      holder.querySelector("input, select, textarea")?.setAttribute("aria-invalid", "true");
    } else rest.push(`${name}: ${text}`);
  }
  const top = form.querySelector(".form-error");
  if (top) top.textContent = [error.message, ...rest].join(" ");
}

export function toast(message) {
  const node = document.getElementById("toast");
  node.textContent = message;
  node.classList.add("shown");
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => node.classList.remove("shown"), 4000);
}

/** Replace a polled section's content, keeping keyboard focus on the same link or button. */
export function swap(container, ...nodes) {
  const active = document.activeElement;
  let selector = null;
  if (active && active !== container && container.contains(active)) {
    const testid = active.getAttribute("data-testid");
    const href = active.getAttribute("href");
    if (testid) selector = `[data-testid="${CSS.escape(testid)}"]`;
    else if (href) selector = `[href="${CSS.escape(href)}"]`;
  }
  container.replaceChildren(...nodes);
  if (selector) container.querySelector(selector)?.focus();
}

/** Run ``load`` but render only the answer of the latest call (polls and clicks overlap). */
export function latest(load, render) {
  let seq = 0;
  return async () => {
    seq += 1;
    const mine = seq;
    const data = await load();
    if (mine === seq) render(data);
  };
}

/** Disable ``button`` while ``action`` runs; report a failure in a toast (and return null). */
export async function busy(button, action) {
  button.disabled = true;
  try {
    return await action();
  } catch (error) {
    toast(error.message || "The request failed.");
    return null;
  } finally {
    button.disabled = false;
  }
}
