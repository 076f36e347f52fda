// One hospital: its status, agent, dataset summary, tokens and jobs. Consortium admins
// issue enrolment codes and revoke tokens here. A hospital the caller may not see is a 404
// from the API, which this page lets through to the router ("Not found").

import { hijackAlerts } from "./hijack-alerts.js";
import { api, apiAll, ApiError } from "../api.js";
import { isConsortiumAdmin, poll } from "../app.js";
import { ago, badge, busy, el, latest, swap, toast } from "../ui.js";
import {
  agentText,
  classCounts,
  connectionBadge,
  hasMasks,
  hospitalStatusBadge,
  imageShapeText,
  showCode,
  loadActiveJobs,
  splitSizesText,
  turnsNow,
} from "./hospitals.js";

const POLL_SECONDS = 5;

export async function render(root, params) {
  const slug = params[0];
  const path = `hospitals/${encodeURIComponent(slug)}/`;
  const admin = isConsortiumAdmin();

  const title = el("h1", {}, slug);
  const codeHolder = el("div", { "aria-live": "polite" });
  const actionsBox = el("div", { class: "actions", "data-testid": "hospital-actions" });
  const detailsBox = el("div", { "data-testid": "hospital-details" });
  const datasetBox = el("div", { "data-testid": "hospital-dataset" });
  const tokensBox = el("div", { "data-testid": "hospital-tokens" });
  const jobsBox = el("div", { "data-testid": "hospital-jobs" });
  const updated = el("p", { class: "muted" });
  let tokensHidden = false;
  let jobsHidden = false;
  let current = null;

  const refresh = latest(
    async () => {
      // The hospital first: a 404 here is the page's answer (let it propagate).
      const hospital = await api(path);
      const [tokens, jobs, activeJobs] = await Promise.all([
        tokensHidden ? null : apiAll(`${path}tokens/`).catch((error) => hiddenOn403(error, "tokens")),
        jobsHidden ? null : apiAll("jobs/", { hospital: slug }).catch((error) => hiddenOn403(error, "jobs")),
        jobsHidden ? [] : loadActiveJobs().catch(() => []),
      ]);
      return { hospital, tokens, jobs, activeJobs };
    },
    ({ hospital, tokens, jobs, activeJobs }) => {
      current = hospital;
      title.textContent = hospital.name;
      swap(detailsBox, details(hospital, turnsNow(activeJobs).get(hospital.slug)));
      swap(datasetBox, dataset(hospital.dataset_summary, hospital.data_problem));
      swap(hijackBox, ...hijackAlerts(hospital.hijack_alerts, "hospital"));
      if (admin) swap(actionsBox, ...actionButtons(hospital));
      if (tokens) swap(tokensBox, tokenTable(tokens));
      if (jobs) swap(jobsBox, jobTable(jobs, slug, hospital.dataset_summary));
      updated.textContent = `Updated ${new Date().toLocaleTimeString()}; refreshes every ${POLL_SECONDS} s.`;
    },
  );

  function hiddenOn403(error, part) {
    if (!(error instanceof ApiError) || error.status !== 403) throw error;
    if (part === "tokens") {
      tokensHidden = true;
      tokensSection.remove();
    } else {
      jobsHidden = true;
      jobsSection.remove();
    }
    return null;
  }

  function actionButtons(hospital) {
    const buttons = [];
    if (hospital.status === "requested" || hospital.status === "rejected") {
      buttons.push(
        actionButton(
          "Approve and issue an enrolment code",
          `approve-${hospital.slug}`,
          "",
          async () => {
            const approval = await api(`${path}approve/`, { method: "POST" });
            if (approval.enrolment_code) showCode(codeHolder, approval.enrolment_code, approval.hospital.name);
            toast(`Approved ${approval.hospital.name}.`);
          },
        ),
      );
    }
    if (["approved", "enrolled", "suspended"].includes(hospital.status)) {
      buttons.push(
        actionButton("Issue an enrolment code", "issue-code", "", async () => {
          const code = await api(`${path}enrolment-codes/`, { method: "POST" });
          showCode(codeHolder, code, hospital.name);
          toast("Issued an enrolment code.");
        }),
      );
    }
    if (["approved", "enrolled", "suspended"].includes(hospital.status)) {
      buttons.push(
        actionButton("Revoke tokens", "revoke-tokens", "danger", async () => {
          const sure = window.confirm(
            `Revoke every token and unused enrolment code of ${hospital.name}? Its agent is cut ` +
              "off at once and the hospital is suspended until it enrols again with a new code.",
          );
          if (!sure) return;
          const revocation = await api(`${path}tokens/revoke/`, { method: "POST" });
          toast(
            `Revoked ${revocation.tokens_revoked} token(s) and ${revocation.codes_revoked} code(s) ` +
              `of ${revocation.hospital.name}.`,
          );
        }),
      );
    }
    if (!buttons.length) buttons.push(el("span", { class: "muted" }, "No action for a hospital that is " + hospital.status + "."));
    return buttons;
  }

  function actionButton(label, testid, kind, action) {
    const button = el("button", { type: "button", class: kind || null, "data-testid": testid }, label);
    button.addEventListener("click", async () => {
      await busy(button, action);
      await refresh().catch((error) => toast(error.message));
    });
    return button;
  }

  const tokensSection = el(
    "section",
    { "aria-labelledby": "tokens-title" },
    el("h2", { id: "tokens-title" }, "Agent tokens"),
    tokensBox,
  );
  const jobsSection = el(
    "section",
    { "aria-labelledby": "jobs-title" },
    el("h2", { id: "jobs-title" }, "Jobs it takes part in"),
    jobsBox,
  );

  const hijackBox = el("div", { "data-testid": "hijack-alerts" });
  root.append(
    title,
    el("p", {}, el("a", { href: "#/hospitals" }, "← All hospitals")),
    codeHolder,
    hijackBox,
    ...(admin ? [actionsBox] : []),
    el(
      "div",
      { class: "grid", style: "margin-top: 1rem" },
      el("section", { class: "card", "aria-labelledby": "details-title" }, el("h2", { id: "details-title", style: "margin-top: 0" }, "Details"), detailsBox),
      el("section", { class: "card", "aria-labelledby": "dataset-title" }, el("h2", { id: "dataset-title", style: "margin-top: 0" }, "Dataset (sizes only)"), datasetBox),
    ),
    tokensSection,
    jobsSection,
    updated,
  );

  await refresh();
  return poll(POLL_SECONDS, async () => {
    try {
      await refresh();
    } catch (error) {
      // Keep what is shown; say it is stale (e.g. the hospital became invisible: 404).
      updated.textContent = `Could not refresh (${error.message}); showing what was last loaded.`;
      if (error instanceof ApiError && error.status === 404 && current) {
        updated.textContent = `${current.name} is no longer visible to you (${error.message}).`;
      }
    }
  });
}

function when(iso) {
  if (!iso) return el("span", { class: "muted" }, "–");
  return el("time", { datetime: iso, title: new Date(iso).toLocaleString() }, ago(iso));
}

function details(h, turnNow) {
  const rows = [
    ["Slug", el("code", {}, h.slug)],
    ["Status", hospitalStatusBadge(h.status)],
    ["Connection", connectionBadge(h)],
    ["Last heartbeat", when(h.last_seen_at)],
    ["Agent status", agentText({ ...h, agent_version: "" }, turnNow)],
    ["Agent version", h.agent_version || "–"],
    ["Asked or registered", when(h.created_at)],
    ["Approved", when(h.approved_at)],
    ["Enrolled", when(h.enrolled_at)],
    ["Contact", h.contact_email ? el("a", { href: `mailto:${h.contact_email}` }, h.contact_email) : "–"],
    ["Identity fingerprint", identity(h)],
    ["Identity generation", h.identity_generation ? String(h.identity_generation) : "–"],
    ["Identity enrolled", when(h.identity_enrolled_at)],
  ];
  if (h.legacy_public_key && !h.identity_fingerprint) {
    rows.push(["Legacy X25519 key", el("code", { style: "word-break: break-all" }, h.legacy_public_key)]);
  }
  return keyValues(rows);
}

// The fingerprint in 16 groups of four hex digits, exactly as `medsplit-agent status` prints
// it at the hospital: administrators compare the two out of band (on the phone, say).
function fingerprintText(hex) {
  return (hex.match(/.{1,4}/g) || []).join(" ");
}

function identity(h) {
  if (!h.identity_fingerprint) {
    const why = h.legacy_public_key
      ? "none yet: its agent moves from its X25519 key at its next start"
      : "none yet: no agent has enrolled";
    return el("span", { class: "muted", "data-testid": "identity-fingerprint" }, why);
  }
  return el(
    "code",
    { "data-testid": "identity-fingerprint", title: "SHA-256 of the agent's ML-DSA-65 identity key" },
    fingerprintText(h.identity_fingerprint),
  );
}

function keyValues(rows) {
  return el(
    "table",
    { class: "key-values" },
    el(
      "tbody",
      {},
      rows.map(([key, value]) => el("tr", {}, el("th", { scope: "row" }, key), el("td", {}, value))),
    ),
  );
}

function dataset(summary, problem) {
  if (problem) {
    // The agent runs, but its data cannot be used: say what its check found (files and
    // checks only; no summary is shown as if it were valid).
    return el(
      "div",
      { role: "alert", "data-testid": "data-problem" },
      el("p", {}, badge("data problem", "error"), " The agent is running, but its local data cannot be used:"),
      el("pre", { class: "problem" }, problem),
    );
  }
  if (!summary || !Object.keys(summary).length) {
    return el("p", { class: "muted" }, "The agent has not reported a dataset yet.");
  }
  // A segmentation set reports the masks each class appears in (a mask holds several).
  const masks = hasMasks(summary);
  const counts = classCounts(summary) || {};
  const labels = Object.keys(counts);
  const numeric = labels.every((l) => /^\d+$/.test(l));
  labels.sort((a, b) => (numeric ? Number(a) - Number(b) : a.localeCompare(b)));
  const total = labels.reduce((sum, label) => sum + Number(counts[label] || 0), 0);
  return el(
    "div",
    {},
    keyValues([
      ["Image shape", imageShapeText(summary)],
      ["Splits", splitSizesText(summary)],
      masks ? ["Masks (segmentation)", String(summary.masks ?? "–")] : ["Labelled samples", String(total)],
    ]),
    labels.length
      ? el(
          "table",
          { style: "margin-top: .8rem" },
          el("caption", {}, masks ? "Masks in which each class appears" : "Samples per label"),
          el(
            "thead",
            {},
            el("tr", {}, el("th", { scope: "col" }, masks ? "Class" : "Label"), el("th", { scope: "col" }, masks ? "Masks" : "Samples")),
          ),
          el(
            "tbody",
            {},
            labels.map((label) => el("tr", {}, el("td", {}, label), el("td", {}, String(counts[label])))),
          ),
        )
      : el("p", { class: "muted" }, "No label counts."),
  );
}

function tokenTable(tokens) {
  if (!tokens.length) return el("p", { class: "muted" }, "No token issued yet: the agent has not enrolled.");
  return el(
    "table",
    { "aria-labelledby": "tokens-title" },
    el(
      "thead",
      {},
      el(
        "tr",
        {},
        ["Key id", "State", "Issued", "Last used", "Revoked"].map((label) => el("th", { scope: "col" }, label)),
      ),
    ),
    el(
      "tbody",
      {},
      tokens.map((t) =>
        el(
          "tr",
          { "data-testid": `token-${t.key_id}` },
          el("td", {}, el("code", {}, t.key_id)),
          el("td", {}, t.active ? badge("active", "ok") : badge("revoked", "cancelled")),
          el("td", {}, when(t.created_at)),
          el("td", {}, t.last_used_at ? when(t.last_used_at) : el("span", { class: "muted" }, "never")),
          el("td", {}, when(t.revoked_at)),
        ),
      ),
    ),
  );
}

// A job whose input shape is not the shape of this hospital's images: its agent resizes
// every image as it is read, which changes what the model sees (and its accuracy); say so.
function resizeNote(job, summary) {
  const theirs = summary?.image_shape;
  const wanted = job.description?.input_shape;
  if (!Array.isArray(theirs) || !Array.isArray(wanted) || !theirs.length) return null;
  if (theirs.length === wanted.length && theirs.every((n, i) => n === wanted[i])) return null;
  return el(
    "div",
    { class: "muted", "data-testid": `resized-${job.id}` },
    `Its images (${theirs.join(" × ")}) are resized to the job's ${wanted.join(" × ")}.`,
  );
}

function jobTable(jobs, slug, summary) {
  if (!jobs.length) return el("p", { class: "muted" }, "It takes part in no job yet.");
  return el(
    "table",
    { "aria-labelledby": "jobs-title" },
    el(
      "thead",
      {},
      el(
        "tr",
        {},
        ["Job", "State", "Model", "Round", "Its place", "Created"].map((label) => el("th", { scope: "col" }, label)),
      ),
    ),
    el(
      "tbody",
      {},
      jobs.map((job) => {
        const me = (job.participants || []).find((p) => p.hospital === slug);
        const count = (job.participants || []).length;
        return el(
          "tr",
          { "data-testid": `job-row-${job.id}` },
          el("td", {}, el("a", { href: `#/jobs/${job.id}` }, job.name || `Job ${job.id}`), el("div", { class: "muted" }, `#${job.id}`)),
          el("td", {}, badge(job.state)),
          el("td", {}, job.model, resizeNote(job, summary)),
          el("td", {}, job.current_round === null || job.current_round === undefined ? "–" : `${job.current_round + 1} / ${job.rounds}`),
          el("td", {}, me ? `${me.position + 1} of ${count}` : "–"),
          el("td", {}, when(job.created_at)),
        );
      }),
    ),
  );
}
