// The job list: every job the signed-in person may see, newest first, filtered by
// state, model and hospital (GET /api/jobs/?state=&model=&hospital=&page=), refreshed
// every few seconds so states and rounds stay current.

import { api } from "../api.js";
import { every, isConsortiumAdmin } from "../app.js";
import { ago, badge, el, table } from "../ui.js";

const STATES = ["draft", "scheduled", "running", "paused", "completed", "failed", "cancelled"];
const FILTERS = ["state", "model", "hospital"];
const PAGE_SIZE = 50; // the API's default page size (coordinator/pagination.py)

/** "x / y": the current round (counted from 1) of the job's rounds. */
export function roundText(job) {
  const current = job.current_round ?? job.round;
  const rounds = job.rounds;
  return `${current === null || current === undefined ? "–" : current + 1} / ${rounds}`;
}

function hashFor(values) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(values)) if (value) query.set(key, value);
  const text = query.toString();
  return `#/jobs${text ? `?${text}` : ""}`;
}

export async function render(root, _params, _session, query = new URLSearchParams()) {
  const current = Object.fromEntries(FILTERS.map((key) => [key, query.get(key) || ""]));
  const page = Math.max(1, Number.parseInt(query.get("page") || "1", 10) || 1);

  root.append(
    el(
      "div",
      { class: "actions", style: "justify-content: space-between" },
      el("h1", {}, "Jobs"),
      isConsortiumAdmin()
        ? el("a", { class: "button", href: "#/jobs/new", "data-testid": "new-job" }, "New job")
        : null,
    ),
  );

  // Filters: a small form; applying it changes the hash, which re-renders the page.
  const state = el(
    "select",
    { name: "state", id: "jobs-filter-state" },
    el("option", { value: "" }, "Any state"),
    STATES.map((s) => el("option", { value: s, selected: s === current.state }, s)),
  );
  const model = el("input", {
    name: "model",
    id: "jobs-filter-model",
    value: current.model,
    placeholder: "e.g. small_cnn",
  });
  const hospital = el("input", {
    name: "hospital",
    id: "jobs-filter-hospital",
    value: current.hospital,
    placeholder: "a hospital's slug",
  });
  const filters = el(
    "form",
    { class: "filters", role: "search", "aria-label": "Filter jobs", style: "max-width: none" },
    el("div", { class: "field" }, el("label", { for: state.id }, "State"), state),
    el("div", { class: "field" }, el("label", { for: model.id }, "Model"), model),
    el("div", { class: "field" }, el("label", { for: hospital.id }, "Hospital"), hospital),
    el(
      "div",
      { class: "actions" },
      el("button", { type: "submit" }, "Filter"),
      el(
        "button",
        {
          type: "button",
          class: "secondary",
          onclick: () => {
            window.location.hash = "#/jobs";
          },
        },
        "Clear",
      ),
    ),
  );
  filters.addEventListener("submit", (event) => {
    event.preventDefault();
    window.location.hash = hashFor({
      state: state.value,
      model: model.value.trim(),
      hospital: hospital.value.trim(),
    });
  });
  // A change of the state menu applies at once (no need to find the button).
  state.addEventListener("change", () => filters.requestSubmit());

  const list = el("div", { "aria-live": "polite", "aria-busy": "true" }, el("p", { class: "muted" }, "Loading…"));
  const pager = el("nav", { class: "actions", "aria-label": "Pages", style: "margin-top: .8rem" });
  root.append(filters, list, pager);

  let firstError = null;
  const refresh = async () => {
    let data;
    try {
      data = await api("jobs/", { query: { ...current, page, page_size: PAGE_SIZE } });
    } catch (error) {
      // Show the problem (a bad filter is a 400 with details) instead of the table.
      if (firstError !== error.message) {
        firstError = error.message;
        const details = Object.entries(error.details || {})
          .map(([key, value]) => `${key}: ${[].concat(value).join(" ")}`)
          .join("; ");
        list.replaceChildren(
          el("div", { class: "error-box", role: "alert" }, error.message, details ? ` (${details})` : ""),
        );
        pager.replaceChildren();
      }
      return;
    }
    firstError = null;
    list.setAttribute("aria-busy", "false");
    list.replaceChildren(
      table(
        [
          {
            label: "Name",
            value: (j) => el("a", { href: `#/jobs/${j.id}` }, j.name || `Job ${j.id}`),
          },
          { label: "Model", value: (j) => j.model },
          { label: "Mode", value: (j) => j.mode },
          { label: "State", value: (j) => badge(j.state) },
          { label: "Round", value: (j) => roundText(j) },
          {
            label: "Hospitals",
            value: (j) => (j.participants || []).map((p) => p.hospital).join(", ") || "–",
          },
          {
            label: "Created",
            value: (j) =>
              el("time", { datetime: j.created_at, title: new Date(j.created_at).toLocaleString() }, ago(j.created_at)),
          },
        ],
        data.results || [],
        {
          empty: FILTERS.some((key) => current[key])
            ? "No job matches these filters."
            : "No jobs yet.",
          caption: `${data.count} job${data.count === 1 ? "" : "s"}`,
        },
      ),
    );
    const pages = Math.max(1, Math.ceil((data.count || 0) / PAGE_SIZE));
    pager.replaceChildren(
      data.previous
        ? el("a", { href: hashFor({ ...current, page: page - 1 > 1 ? page - 1 : "" }) }, "← Newer")
        : null,
      data.previous || data.next ? el("span", { class: "muted" }, `Page ${page} of ${pages}`) : null,
      data.next ? el("a", { href: hashFor({ ...current, page: page + 1 }) }, "Older →") : null,
    );
  };
  return every(5, refresh);
}
