// The audit log: every recorded event, newest first, filtered and paginated by the API;
// whether the hash chain verifies; and exports of the filtered range (CSV, JSON Lines).
//
// The applied filters live in the hash's query (``#/audit?action=turn.failed&page=2``)
// so a filtered view can be linked. Applying filters or turning pages updates the hash
// with history.pushState (no hashchange, so the page updates in place and keeps focus);
// Back and Forward change the hash, and the router renders the page again from it.

import { api, ApiError } from "../api.js";
import { ago, badge, bytes, el, field, showErrors } from "../ui.js";

/** The list's query parameters (platform/audit/filters.py), in the order of the form. */
const FILTERS = ["actor", "action", "hospital", "job", "created_after", "created_before"];
const PAGE_SIZE = 50;
const READS_WHOLE_LOG = new Set(["consortium_admin", "observer"]);

/** Actions the platform records (grep -rn 'action=' platform), for the action field. */
const ACTIONS = [
  "job.created",
  "job.scheduled",
  "job.running",
  "job.paused",
  "job.completed",
  "job.failed",
  "job.cancelled",
  "turn.started",
  "turn.finished",
  "turn.failed",
  "turn.taken_over",
  "turn.run_interrupted",
  "turn.resumed",
  "agent.started",
  "relay.user_suspended",
  "relay.user_lifted",
  "turn.problem_reported",
  "handoff.recorded",
  "aggregation.opened",
  "aggregation.submitted",
  "aggregation.done",
  "aggregation.restarted",
  "aggregation.failed",
  "alignment.agreed",
  "alignment.mismatch",
  "alignment.too_small",
  "hospital.registered",
  "hospital.join_requested",
  "hospital.approved",
  "hospital.rejected",
  "enrolment_code.issued",
  "agent.enrolled",
  "agent.enrol_failed",
  "agent.reported",
  "token.issued",
  "token.rotated",
  "token.revoked",
  "person.created",
  "person.updated",
  "auth.signed_in",
  "auth.signed_out",
  "auth.sign_in_failed",
  "auth.sign_in_delayed",
  "auth.sign_in_throttled",
  "relay.workers_user_provisioned",
  "relay.users_restored",
];

// -- the hash's query ---------------------------------------------------------------

/** The filters and page in ``window.location.hash`` after ``?``. */
function readHashQuery() {
  const hash = window.location.hash || "";
  const at = hash.indexOf("?");
  const params = new URLSearchParams(at >= 0 ? hash.slice(at + 1) : "");
  const filters = {};
  for (const name of FILTERS) {
    const value = (params.get(name) || "").trim();
    if (value) filters[name] = value;
  }
  const page = Number.parseInt(params.get("page") || "1", 10);
  return { filters, page: Number.isFinite(page) && page > 1 ? page : 1 };
}

function queryString(filters, page = 1) {
  const params = new URLSearchParams();
  for (const name of FILTERS) if (filters[name]) params.set(name, filters[name]);
  if (page > 1) params.set("page", String(page));
  return params.toString();
}

function hashFor(filters, page) {
  const query = queryString(filters, page);
  return query ? `#/audit?${query}` : "#/audit";
}

// -- times ----------------------------------------------------------------------------

/** A datetime-local value ("2024-05-01T10:30", local time) as ISO 8601 in UTC. */
function localToIso(value) {
  if (!value) return "";
  const date = new Date(value); // a date-time without an offset is local time
  if (Number.isNaN(date.getTime())) return "";
  return date.toISOString().replace(".000Z", "Z");
}

/** ISO 8601 as a datetime-local value in local time; "" when it does not parse. */
function isoToLocal(iso) {
  if (!iso) return "";
  const date = parseIso(iso);
  if (!date) return "";
  const pad = (n) => String(n).padStart(2, "0");
  const seconds = date.getSeconds() ? `:${pad(date.getSeconds())}` : "";
  return (
    `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}` +
    `T${pad(date.getHours())}:${pad(date.getMinutes())}${seconds}`
  );
}

/** The API writes six digits of microseconds; Date reliably reads three. */
function parseIso(iso) {
  const date = new Date(String(iso).replace(/(\.\d{3})\d+/, "$1"));
  return Number.isNaN(date.getTime()) ? null : date;
}

function timeCell(iso) {
  const date = parseIso(iso);
  if (!date) return iso || "–";
  const shown = date.toLocaleString(undefined, {
    year: "numeric",
    month: "short",
    day: "numeric",
    hour: "2-digit",
    minute: "2-digit",
    second: "2-digit",
  });
  return el("time", { datetime: iso, title: `${iso} (${ago(date.toISOString())})` }, shown);
}

// -- details ----------------------------------------------------------------------------

const MAX_VALUE = 60;
const MAX_PAIRS = 6;
const whole = new Intl.NumberFormat();
/** Keys whose numbers count records, not bytes: alignment.* events' details. */
const RECORD_COUNTS = new Set(["size", "minimum"]);

// PostgreSQL keeps JSON objects in its own key order: the summary orders them itself, the
// usual keys of an event first, the rest (and every nested map) alphabetically.
const FIRST = ["reason", "round", "position", "attempt", "steps", "samples", "bytes_up", "bytes_down", "metrics", "crossed"];
const sorted = (object) => Object.entries(object).sort(([a], [b]) => a.localeCompare(b));
function ordered(details) {
  const rank = (key) => (FIRST.includes(key) ? FIRST.indexOf(key) : FIRST.length);
  return sorted(details).sort(([a], [b]) => rank(a) - rank(b));
}

function truncate(text, max) {
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/** What crossed the cut ({"up"|"down": {kind: {tensor: dtype}}}) in words: names only. */
function crossedText(crossed) {
  const sides = [];
  for (const direction of ["up", "down", ...Object.keys(crossed || {}).filter((d) => d !== "up" && d !== "down")]) {
    const kinds = (crossed || {})[direction];
    const parts = sorted(kinds || {}).map(([kind, tensors]) => {
      const names = Object.keys(tensors || {}).sort();
      return `${kind.replace(/_/g, " ")} (${names.join(", ") || "nothing"})`;
    });
    if (parts.length) sides.push(`${direction}: ${parts.join("; ")}`);
  }
  return sides.join(" · ");
}

/** One value for people: numbers grouped, sizes in bytes, small maps as pairs. */
function valueText(key, value) {
  if (value === null || value === undefined) return "none";
  if (typeof value === "number") {
    // A record alignment's sizes and minimum count records (training/alignment.py).
    if (RECORD_COUNTS.has(key)) return `${whole.format(value)} records`;
    if (/bytes|size/.test(key)) return bytes(value);
    return Number.isInteger(value) ? whole.format(value) : value.toFixed(4);
  }
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (typeof value === "string") return value || "“”";
  if (Array.isArray(value)) return value.length <= 4 ? value.map((v) => valueText(key, v)).join(", ") : `${value.length} items`;
  if (key === "crossed") return crossedText(value);
  if (key === "sizes") return sorted(value).map(([k, v]) => `${k} ${valueText("size", v)}`).join(", ");
  const entries = sorted(value);
  if (!entries.length) return "none";
  if (entries.length <= 6 && entries.every(([, v]) => v === null || typeof v !== "object")) {
    return entries.map(([k, v]) => `${k.replace(/_/g, " ")} ${valueText(k, v)}`).join(", ");
  }
  return `${entries.length} fields`;
}

/** A readable summary of an event's details, and the JSON itself on demand. */
function detailsCell(details) {
  if (!details || typeof details !== "object" || !Object.keys(details).length) {
    return el("span", { class: "muted" }, "–");
  }
  const entries = ordered(details);
  const pairs = entries
    .slice(0, MAX_PAIRS)
    .map(([key, value]) => `${key.replace(/_/g, " ")}: ${truncate(valueText(key, value), key === "crossed" ? 3 * MAX_VALUE : 2 * MAX_VALUE)}`);
  if (entries.length > MAX_PAIRS) pairs.push(`+${entries.length - MAX_PAIRS} more`);
  return el(
    "div",
    { class: "audit-details" },
    el("div", { "data-testid": "audit-summary" }, pairs.join(" · ")),
    el(
      "details",
      {},
      el("summary", {}, "JSON"),
      el("pre", { "data-testid": "audit-json" }, JSON.stringify(details, null, 2)),
    ),
  );
}

// -- the page -------------------------------------------------------------------------

export async function render(root, params, session) {
  const role = session?.me?.role || null;
  const ownHospital = session?.me?.hospital || null;
  let stopped = false;
  let listRequest = 0;
  let { filters: applied, page } = readHashQuery();

  // The filters form: one labelled field per query parameter, named like it, so the
  // API's 400 details land beside the right field (showErrors).
  const inputs = {
    actor: el("input", {
      name: "actor",
      type: "text",
      autocomplete: "off",
      spellcheck: "false",
      placeholder: "person:ada",
    }),
    action: el("input", {
      name: "action",
      type: "text",
      list: "audit-actions",
      autocomplete: "off",
      spellcheck: "false",
      placeholder: "turn.failed",
    }),
    hospital: el("input", {
      name: "hospital",
      type: "text",
      autocomplete: "off",
      spellcheck: "false",
      placeholder: "st-marys",
    }),
    job: el("input", { name: "job", type: "number", min: "1", step: "1", inputmode: "numeric" }),
    created_after: el("input", { name: "created_after", type: "datetime-local" }),
    created_before: el("input", { name: "created_before", type: "datetime-local" }),
  };
  for (const [name, input] of Object.entries(inputs)) input.id = `audit-${name}`;
  const datalist = el(
    "datalist",
    { id: "audit-actions" },
    ACTIONS.map((action) => el("option", { value: action })),
  );
  const narrow = (node, width) => {
    node.style.flex = `0 1 ${width}`;
    return node;
  };
  const form = el(
    "form",
    {
      class: "filters",
      "data-testid": "audit-filters",
      "aria-label": "Filter the audit log",
      novalidate: true,
      style: "max-width: none",
    },
    narrow(field("Actor", inputs.actor), "11rem"),
    narrow(field("Action", inputs.action), "12rem"),
    narrow(field("Hospital", inputs.hospital), "10rem"),
    narrow(field("Job", inputs.job), "6rem"),
    narrow(field("From (local time)", inputs.created_after), "14rem"),
    narrow(field("Until (local time)", inputs.created_before), "14rem"),
    datalist,
    el(
      "div",
      { class: "actions", style: "padding-bottom: .2rem" },
      el("button", { type: "submit" }, "Apply"),
      el("button", { type: "button", class: "secondary", onclick: clearFilters }, "Clear"),
    ),
    el("p", { class: "form-error", role: "alert", style: "flex-basis: 100%; margin: 0" }),
  );

  const chainStatus = el("div", {
    class: "card",
    "data-testid": "chain-status",
    "data-state": "checking",
    role: "status",
    "aria-live": "polite",
    style: "display: flex; gap: .75rem; align-items: center; flex-wrap: wrap",
  });

  const csvLink = el(
    "a",
    { class: "button", "data-testid": "export-csv", download: "audit.csv", href: "#" },
    "Export CSV",
  );
  const jsonlLink = el(
    "a",
    { class: "button", "data-testid": "export-jsonl", download: "audit.jsonl", href: "#" },
    "Export JSON Lines",
  );
  const exportNote = el("span", { class: "muted" });

  const summary = el("p", { class: "muted", role: "status", "aria-live": "polite" });
  const tableHolder = el("div", { style: "overflow-x: auto" });
  const prevButton = el(
    "button",
    { type: "button", class: "secondary", "data-testid": "audit-prev" },
    "← Previous",
  );
  const nextButton = el(
    "button",
    { type: "button", class: "secondary", "data-testid": "audit-next" },
    "Next →",
  );
  const pageLabel = el("span", { class: "muted" });
  prevButton.disabled = true;
  nextButton.disabled = true;
  const pager = el(
    "nav",
    { class: "actions", "aria-label": "Audit log pages", style: "margin-top: .8rem" },
    prevButton,
    pageLabel,
    nextButton,
  );

  root.append(
    el("h1", {}, "Audit log"),
    el(
      "p",
      { class: "muted" },
      "Every action recorded by the coordinator, newest first. Each event is hash-chained " +
        "to the one before it, so changes made behind the application's back show up below.",
      role === "hospital_admin" && ownHospital
        ? ` You see the events about ${ownHospital}.`
        : null,
    ),
    chainStatus,
    el("h2", {}, "Filter"),
    form,
    el(
      "div",
      { class: "actions", style: "margin-bottom: .8rem" },
      csvLink,
      jsonlLink,
      exportNote,
    ),
    summary,
    tableHolder,
    pager,
  );

  // -- filters ------------------------------------------------------------------------

  function fillForm() {
    for (const name of ["actor", "action", "hospital", "job"]) {
      inputs[name].value = applied[name] || "";
    }
    for (const name of ["created_after", "created_before"]) {
      inputs[name].value = isoToLocal(applied[name]);
      // Seconds from a link are kept; the picker then shows them too.
      inputs[name].step = inputs[name].value.length > 16 ? "1" : "60";
    }
  }

  function readForm() {
    const filters = {};
    for (const name of ["actor", "action", "hospital", "job"]) {
      const value = inputs[name].value.trim();
      if (value) filters[name] = value;
    }
    for (const name of ["created_after", "created_before"]) {
      const iso = localToIso(inputs[name].value);
      if (iso) filters[name] = iso;
    }
    return filters;
  }

  function apply(filters, newPage) {
    applied = filters;
    page = newPage;
    const hash = hashFor(applied, page);
    if (window.location.hash !== hash) window.history.pushState(null, "", hash);
    updateExports();
    return loadPage();
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    apply(readForm(), 1);
  });

  function clearFilters() {
    for (const input of Object.values(inputs)) input.value = "";
    apply({}, 1);
    inputs.actor.focus();
  }

  function updateExports() {
    const query = queryString(applied);
    csvLink.href = `/api/audit/export.csv${query ? `?${query}` : ""}`;
    jsonlLink.href = `/api/audit/export.jsonl${query ? `?${query}` : ""}`;
    const filtered = Object.keys(applied).length > 0;
    exportNote.textContent = filtered
      ? "Exports hold every event matching these filters (not just this page), oldest first."
      : "Exports hold every event you may read, oldest first.";
  }

  // -- the list ---------------------------------------------------------------------

  async function loadPage() {
    const request = ++listRequest;
    tableHolder.setAttribute("aria-busy", "true");
    summary.textContent = "Loading…";
    showErrors(form, { message: "", details: {} });
    let data;
    try {
      data = await api("audit/events/", {
        query: { ...applied, page: page > 1 ? page : undefined, page_size: PAGE_SIZE },
      });
    } catch (error) {
      if (stopped || request !== listRequest) return;
      tableHolder.removeAttribute("aria-busy");
      showListError(error);
      return;
    }
    if (stopped || request !== listRequest) return;
    tableHolder.removeAttribute("aria-busy");
    const rows = Array.isArray(data?.results) ? data.results : [];
    const count = Number.isFinite(data?.count) ? data.count : rows.length;
    const pages = Math.max(1, Math.ceil(count / PAGE_SIZE));
    tableHolder.replaceChildren(eventsTable(rows));
    summary.textContent =
      count === 0
        ? "No events match."
        : `${count} event${count === 1 ? "" : "s"}${
            Object.keys(applied).length ? " match these filters" : ""
          }; showing ${(page - 1) * PAGE_SIZE + 1}–${(page - 1) * PAGE_SIZE + rows.length}.`;
    pageLabel.textContent = `Page ${page} of ${pages}`;
    const hadFocus = document.activeElement;
    prevButton.disabled = !data?.previous;
    nextButton.disabled = !data?.next;
    // A button that just became disabled drops focus: hand it to the other one.
    if (hadFocus === nextButton && nextButton.disabled && !prevButton.disabled) prevButton.focus();
    if (hadFocus === prevButton && prevButton.disabled && !nextButton.disabled) nextButton.focus();
  }

  function showListError(error) {
    prevButton.disabled = true;
    nextButton.disabled = true;
    pageLabel.textContent = "";
    summary.textContent = "";
    if (error instanceof ApiError && error.status === 400) {
      // A malformed filter: say which, beside its field. "__all__" is the form's own check.
      const details = { ...error.details };
      const general = details.__all__ || details.non_field_errors;
      delete details.__all__;
      delete details.non_field_errors;
      const message = [error.message, ...(general ? [].concat(general) : [])].join(": ");
      showErrors(form, { message, details });
      tableHolder.replaceChildren(
        el("p", { class: "muted" }, "Fix the filters above to see the events."),
      );
      return;
    }
    if (error instanceof ApiError && error.status === 404 && page > 1) {
      tableHolder.replaceChildren(
        el(
          "p",
          { class: "muted" },
          `There is no page ${page} for these filters. `,
          el(
            "button",
            { type: "button", class: "secondary", onclick: () => apply(applied, 1) },
            "Go to the first page",
          ),
        ),
      );
      return;
    }
    const denied = error instanceof ApiError && error.status === 403;
    tableHolder.replaceChildren(
      el(
        "div",
        { class: "error-box", role: "alert" },
        el(
          "strong",
          {},
          denied ? "You may not read the audit log." : "The audit log could not be loaded.",
        ),
        el("p", { style: "margin: .3rem 0 0" }, error.message),
      ),
    );
  }

  prevButton.addEventListener("click", () => {
    if (page > 1) apply(applied, page - 1);
  });
  nextButton.addEventListener("click", () => apply(applied, page + 1));

  function eventsTable(rows) {
    const columns = [
      ["#", (e) => el("span", { title: `hash ${e.hash}\nprev ${e.prev_hash}` }, String(e.id))],
      ["Time", (e) => timeCell(e.created_at)],
      ["Actor", (e) => e.actor || "–"],
      ["Action", (e) => el("code", {}, e.action)],
      [
        "Hospital",
        (e) =>
          e.hospital
            ? el("a", { href: `#/hospitals/${encodeURIComponent(e.hospital)}` }, e.hospital)
            : "–",
      ],
      ["Job", (e) => (e.job_id ? el("a", { href: `#/jobs/${e.job_id}` }, `#${e.job_id}`) : "–")],
      ["Target", (e) => e.target || "–"],
      ["Details", (e) => detailsCell(e.details)],
    ];
    const cellStyle = {
      Time: "white-space: nowrap",
      Actor: "overflow-wrap: anywhere; max-width: 12rem",
      Target: "overflow-wrap: anywhere; max-width: 10rem",
      Details: "overflow-wrap: anywhere; max-width: 26rem; font-size: .9rem",
    };
    const body = rows.length
      ? rows.map((event) =>
          el(
            "tr",
            { "data-testid": "audit-row", "data-id": event.id },
            columns.map(([label, value]) => el("td", { style: cellStyle[label] }, value(event))),
          ),
        )
      : [
          el(
            "tr",
            {},
            el(
              "td",
              { colspan: String(columns.length), class: "muted" },
              "No events match these filters.",
            ),
          ),
        ];
    return el(
      "table",
      { "data-testid": "audit-table" },
      el("caption", {}, "Audit events, newest first"),
      el("thead", {}, el("tr", {}, columns.map(([label]) => el("th", { scope: "col" }, label)))),
      el("tbody", {}, body),
    );
  }

  // -- the chain ----------------------------------------------------------------------

  const recheck = el(
    "button",
    { type: "button", class: "secondary", onclick: () => checkChain() },
    "Check again",
  );

  async function checkChain() {
    if (!READS_WHOLE_LOG.has(role)) {
      chainStatus.dataset.state = "not-allowed";
      chainStatus.replaceChildren(
        el(
          "span",
          { class: "muted" },
          "Only consortium admins and observers can check the whole audit chain.",
        ),
      );
      return;
    }
    chainStatus.dataset.state = "checking";
    recheck.disabled = true;
    chainStatus.replaceChildren(el("span", { class: "muted" }, "Checking the hash chain…"));
    let result;
    try {
      result = await api("audit/verify/");
    } catch (error) {
      if (stopped) return;
      recheck.disabled = false;
      if (error instanceof ApiError && error.status === 403) {
        chainStatus.dataset.state = "not-allowed";
        chainStatus.replaceChildren(
          el("span", { class: "muted" }, "Your role may not check the audit chain."),
        );
        return;
      }
      chainStatus.dataset.state = "error";
      chainStatus.replaceChildren(
        badge("chain not checked", "error"),
        el("span", {}, error.message),
        recheck,
      );
      return;
    }
    if (stopped) return;
    recheck.disabled = false;
    const checkedAt = el("span", { class: "muted" }, `checked ${new Date().toLocaleTimeString()}`);
    if (result.ok) {
      chainStatus.dataset.state = "ok";
      chainStatus.replaceChildren(
        el(
          "span",
          { class: "badge badge-ok", title: `head ${result.head_id}: ${result.head_hash}` },
          `✓ chain verifies: ${result.checked} event${result.checked === 1 ? "" : "s"}`,
        ),
        checkedAt,
        recheck,
      );
      return;
    }
    const problem = result.problem || {};
    const where = problem.row_id ? `at row ${problem.row_id}` : "";
    chainStatus.dataset.state = "broken";
    chainStatus.replaceChildren(
      el(
        "span",
        { class: "badge badge-broken", title: problem.kind || "" },
        `✗ chain broken ${where}`.trim(),
      ),
      el(
        "span",
        { style: "color: var(--bad); overflow-wrap: anywhere; flex: 1 1 30rem" },
        `${problem.message || "the chain does not verify"} (${result.checked} event${
          result.checked === 1 ? "" : "s"
        } verified before it).`,
      ),
      checkedAt,
      recheck,
    );
  }

  fillForm();
  updateExports();
  checkChain();
  await loadPage();
  return () => {
    stopped = true;
  };
}
