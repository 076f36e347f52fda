// The hospitals of the consortium: their status, agents and datasets (sizes only).
// Consortium admins also register hospitals and answer join requests here; the one-time
// enrolment code an approval issues is shown once, in a box polling never replaces.

import { api, apiAll } from "../api.js";
import { isConsortiumAdmin, poll } from "../app.js";
import { ago, badge, busy, el, field, latest, showErrors, swap, toast } from "../ui.js";

const POLL_SECONDS = 5;

// -- parts the hospital and overview pages share ----------------------------------------

export function hospitalStatusBadge(status) {
  return badge(status || "unknown");
}

const AGENT_KINDS = { idle: "ok", busy: "busy", starting: "pending", error: "error", data_problem: "error" };
const AGENT_WORDS = { data_problem: "data problem" };

export function agentStatusBadge(status) {
  if (!status) return el("span", { class: "muted" }, "–");
  return badge(AGENT_WORDS[status] || status, AGENT_KINDS[status] || status);
}

/** Online / offline for a hospital with an agent; "no agent" for one never enrolled. */
export function connectionBadge(hospital) {
  if (hospital.online) return badge("online");
  if (!hospital.last_seen_at && !["enrolled", "suspended"].includes(hospital.status)) {
    return el("span", { class: "muted" }, "no agent");
  }
  return badge("offline");
}

/** The running and paused jobs with their status (GET jobs/<id>/status/): the one record
 * of which hospital's turn runs, read by the overview's job rows and every hospital table. */
export async function loadActiveJobs() {
  const [running, paused] = await Promise.all([
    apiAll("jobs/", { state: "running" }),
    apiAll("jobs/", { state: "paused" }),
  ]);
  const jobs = [...running, ...paused].sort((a, b) => b.id - a.id);
  const statuses = await Promise.all(jobs.map((job) => api(`jobs/${job.id}/status/`).catch(() => null)));
  return jobs.map((job, i) => ({ job, status: statuses[i] }));
}

/** Hospital slug -> the turn of it that is running now (its job, round and attempt). */
export function turnsNow(activeJobs) {
  const now = new Map();
  for (const { job, status } of activeJobs || []) {
    const turn = status?.turn;
    if (status?.state !== "running" || turn?.status !== "running") continue;
    now.set(turn.hospital, { job: job.id, jobName: job.name || `Job ${job.id}`, round: status.round, attempt: turn.attempt });
  }
  return now;
}

/** "in its turn" (with its job and round) while a turn of it runs; else what its agent's
 * last heartbeat said (idle, busy, ...), which lags by up to a heartbeat. */
export function agentText(hospital, turnNow) {
  const version = hospital.agent_version ? ` v${hospital.agent_version}` : null;
  if (turnNow) {
    return el(
      "span",
      { "data-testid": `in-turn-${hospital.slug}` },
      badge("in its turn", "busy"),
      " ",
      el("a", { href: `#/jobs/${turnNow.job}` }, turnNow.jobName),
      `, round ${turnNow.round + 1}`,
      turnNow.attempt > 1 ? `, attempt ${turnNow.attempt}` : "",
      version,
    );
  }
  if (!hospital.agent_status && !hospital.agent_version) return el("span", { class: "muted" }, "–");
  return el("span", {}, agentStatusBadge(hospital.agent_status), version);
}

function sortedLabels(counts) {
  const labels = Object.keys(counts || {});
  const numeric = labels.every((l) => /^\d+$/.test(l));
  return labels.sort((a, b) => (numeric ? Number(a) - Number(b) : a.localeCompare(b)));
}

export function imageShapeText(summary) {
  const shape = summary?.image_shape;
  return Array.isArray(shape) && shape.length ? shape.join(" × ") : "–";
}

/** Whether a dataset summary is a segmentation set's (a mask per image). */
export const hasMasks = (summary) => summary?.task === "segmentation";

/** Samples per label, or for a segmentation set the masks each class appears in. */
export const classCounts = (summary) => (hasMasks(summary) ? summary?.mask_classes : summary?.label_counts);

export function labelCountsText(summary, max = 6) {
  const counts = classCounts(summary);
  if (!counts || !Object.keys(counts).length) return "–";
  const labels = sortedLabels(counts);
  const parts = labels.map((label) => `${label}: ${counts[label]}`);
  const shown = parts.slice(0, max).join(" · ");
  return parts.length > max ? `${shown} · +${parts.length - max} more` : shown;
}

export function splitSizesText(summary) {
  const sizes = summary?.split_sizes;
  if (!sizes) return "–";
  const parts = ["train", "val", "test"]
    .filter((name) => sizes[name] !== undefined && sizes[name] !== null)
    .map((name) => `${name} ${sizes[name]}`);
  return parts.length ? parts.join(" · ") : "–";
}

/** A compact dataset summary for a table cell. */
export function datasetCell(summary) {
  if (!summary) return el("span", { class: "muted" }, "not reported");
  const labels = labelCountsText(summary);
  const all = labelCountsText(summary, Infinity);
  return el(
    "div",
    { class: "dataset" },
    el("div", {}, el("span", { class: "muted" }, "image "), imageShapeText(summary)),
    el("div", { title: all }, el("span", { class: "muted" }, hasMasks(summary) ? "masks by class " : "labels "), labels),
    el("div", {}, el("span", { class: "muted" }, "splits "), splitSizesText(summary)),
  );
}

/** The one-time enrolment code, with a clear note that it will not be shown again. */
export function codeBox(code, hospitalName, onDismiss) {
  const box = el(
    "div",
    { class: "card code-card", role: "region", "aria-label": "Enrolment code", style: "margin-bottom: 1rem" },
    el("h2", { style: "margin-top: 0" }, `Enrolment code for ${hospitalName}`),
    el(
      "p",
      {},
      el("strong", {}, "Shown once. "),
      "Copy it now and give it to the hospital's IT team over a trusted channel: it cannot be " +
        "shown again. It works once",
      code.expires_at ? `, until ${new Date(code.expires_at).toLocaleString()}` : "",
      ". If it is lost, issue a new one from the hospital's page.",
    ),
    el("div", { class: "secret", "data-testid": "enrolment-code", tabindex: "0" }, code.code),
  );
  const copy = el(
    "button",
    {
      type: "button",
      class: "secondary",
      onclick: async () => {
        try {
          await navigator.clipboard.writeText(code.code);
          toast("Copied the enrolment code.");
        } catch {
          toast("Could not copy: select the code and copy it by hand.");
        }
      },
    },
    "Copy code",
  );
  const hide = el(
    "button",
    {
      type: "button",
      class: "secondary",
      onclick: () => {
        box.remove();
        if (onDismiss) onDismiss();
      },
    },
    "I have copied it, hide it",
  );
  box.append(el("div", { class: "actions" }, copy, hide));
  return box;
}

/** Show ``code`` in ``holder`` (replacing any earlier one) and move focus to it. */
export function showCode(holder, code, hospitalName) {
  const box = codeBox(code, hospitalName);
  holder.replaceChildren(box);
  box.querySelector("[data-testid='enrolment-code']").focus();
  box.scrollIntoView?.({ block: "nearest" });
}

// -- the page ----------------------------------------------------------------------------

export async function render(root) {
  const admin = isConsortiumAdmin();
  const codeHolder = el("div", { "aria-live": "polite" });
  const requestsBox = el("div", { "data-testid": "join-requests" });
  const listBox = el("div", { "data-testid": "hospital-list" });
  const updated = el("p", { class: "muted" });
  const working = new Set(); // slugs with an approve or reject in flight

  root.append(el("h1", {}, "Hospitals"), codeHolder);
  if (admin) root.append(registerForm());
  if (admin) root.append(el("h2", { id: "join-requests-title" }, "Pending join requests"), requestsBox);
  root.append(el("h2", { id: "hospital-list-title" }, "All hospitals"), listBox, updated);

  const refresh = latest(
    () => Promise.all([apiAll("hospitals/"), loadActiveJobs()]),
    ([hospitals, activeJobs]) => {
      swap(listBox, hospitalTable(hospitals, { labelledBy: "hospital-list-title", turns: turnsNow(activeJobs) }));
      if (admin) swap(requestsBox, requestsTable(hospitals.filter((h) => h.status === "requested")));
      updated.textContent = `Updated ${new Date().toLocaleTimeString()}; refreshes every ${POLL_SECONDS} s.`;
    },
  );

  function registerForm() {
    const name = el("input", { name: "name", required: true, maxlength: "200", autocomplete: "off" });
    const slug = el("input", {
      name: "slug",
      maxlength: "64",
      pattern: "[a-z0-9-]+",
      autocomplete: "off",
    });
    const email = el("input", { name: "contact_email", type: "email", autocomplete: "off" });
    const approve = el("input", {
      name: "approve",
      type: "checkbox",
      checked: true,
      style: "width: auto",
    });
    const submit = el("button", { type: "submit" }, "Register");
    const form = el(
      "form",
      {
        class: "card",
        "data-testid": "register-form",
        "aria-labelledby": "register-title",
        novalidate: true,
      },
      el("h2", { id: "register-title", style: "margin-top: 0" }, "Register a hospital"),
      field("Name", name),
      field("Slug (optional)", slug, "Lowercase letters, digits and dashes; made from the name when left empty."),
      field("Contact email (optional)", email),
      field(
        "Approve now and issue an enrolment code",
        approve,
        "Leave unticked to list it among the pending join requests instead.",
      ),
      el("p", { class: "form-error", role: "alert" }),
      el("div", { class: "actions" }, submit),
    );
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      showErrors(form, { message: "", details: {} });
      const body = { name: name.value.trim(), contact_email: email.value.trim(), approve: approve.checked };
      if (slug.value.trim()) body.slug = slug.value.trim();
      submit.disabled = true;
      try {
        const registration = await api("hospitals/", { method: "POST", body });
        const hospital = registration.hospital;
        form.reset();
        approve.checked = true;
        if (registration.enrolment_code) {
          showCode(codeHolder, registration.enrolment_code, hospital.name);
        } else {
          codeHolder.replaceChildren();
          name.focus();
        }
        toast(`Registered ${hospital.name} (${hospital.slug}).`);
        await refresh();
      } catch (error) {
        if (error.details !== undefined) showErrors(form, error);
        else toast(error.message);
      } finally {
        submit.disabled = false;
      }
    });
    return form;
  }

  function requestsTable(requested) {
    if (!requested.length) return el("p", { class: "muted" }, "No hospital is waiting for approval.");
    return el(
      "table",
      { "aria-labelledby": "join-requests-title" },
      el(
        "thead",
        {},
        el(
          "tr",
          {},
          ["Hospital", "Contact", "Asked", "Answer"].map((label) => el("th", { scope: "col" }, label)),
        ),
      ),
      el(
        "tbody",
        {},
        requested.map((h) =>
          el(
            "tr",
            { "data-testid": `join-request-${h.slug}` },
            el("td", {}, el("a", { href: `#/hospitals/${h.slug}` }, h.name), el("div", { class: "muted" }, h.slug)),
            el("td", {}, h.contact_email ? el("a", { href: `mailto:${h.contact_email}` }, h.contact_email) : "–"),
            el("td", {}, ago(h.created_at)),
            el("td", {}, el("div", { class: "actions" }, approveButton(h), rejectButton(h))),
          ),
        ),
      ),
    );
  }

  function approveButton(h) {
    const button = el(
      "button",
      {
        type: "button",
        "data-testid": `approve-${h.slug}`,
        "aria-label": `Approve ${h.name}`,
        disabled: working.has(h.slug),
      },
      "Approve",
    );
    button.addEventListener("click", async () => {
      working.add(h.slug);
      // A new code replaces the one shown (a lost code is replaced from the hospital's page).
      codeHolder.replaceChildren();
      const approval = await busy(button, () =>
        api(`hospitals/${encodeURIComponent(h.slug)}/approve/`, { method: "POST" }),
      );
      working.delete(h.slug);
      if (approval) {
        if (approval.enrolment_code) showCode(codeHolder, approval.enrolment_code, approval.hospital.name);
        toast(`Approved ${approval.hospital.name}.`);
      }
      await refresh().catch(() => null);
    });
    return button;
  }

  function rejectButton(h) {
    const button = el(
      "button",
      {
        type: "button",
        class: "danger",
        "data-testid": `reject-${h.slug}`,
        "aria-label": `Reject ${h.name}`,
        disabled: working.has(h.slug),
      },
      "Reject",
    );
    button.addEventListener("click", async () => {
      const reason = window.prompt(`Reject ${h.name}? Give a reason (optional):`, "");
      if (reason === null) return;
      working.add(h.slug);
      const rejected = await busy(button, () =>
        api(`hospitals/${encodeURIComponent(h.slug)}/reject/`, { method: "POST", body: { reason } }),
      );
      working.delete(h.slug);
      if (rejected) toast(`Rejected ${rejected.name}.`);
      await refresh().catch(() => null);
    });
    return button;
  }

  await refresh();
  return poll(POLL_SECONDS, refresh);
}

/** The hospitals as a table; ``withDataset`` adds the slug and the dataset summary. */
export function hospitalTable(hospitals, { labelledBy, withDataset = true, turns = new Map() } = {}) {
  if (!hospitals.length) return el("p", { class: "muted" }, "No hospital yet.");
  const columns = ["Hospital", "Status", "Connection", "Last heartbeat", "Agent"];
  if (withDataset) columns.push("Dataset");
  return el(
    "table",
    { "aria-labelledby": labelledBy },
    el("thead", {}, el("tr", {}, columns.map((label) => el("th", { scope: "col" }, label)))),
    el(
      "tbody",
      {},
      hospitals.map((h) =>
        el(
          "tr",
          { "data-testid": `hospital-row-${h.slug}` },
          el(
            "td",
            {},
            el("a", { href: `#/hospitals/${h.slug}` }, h.name),
            withDataset ? el("div", { class: "muted" }, h.slug) : null,
          ),
          el("td", {}, hospitalStatusBadge(h.status)),
          el("td", {}, connectionBadge(h)),
          el(
            "td",
            { title: h.last_seen_at ? new Date(h.last_seen_at).toLocaleString() : null },
            ago(h.last_seen_at),
          ),
          el("td", {}, agentText(h, turns.get(h.slug))),
          withDataset ? el("td", {}, datasetCell(h.dataset_summary)) : null,
        ),
      ),
    ),
  );
}
