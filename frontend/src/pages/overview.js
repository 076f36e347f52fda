// At a glance: which hospitals are online, how the running jobs are getting on, what went
// wrong lately (from the audit log) and whether the audit chain still verifies.

import { api, apiAll, ApiError } from "../api.js";
import { poll } from "../app.js";
import { ago, badge, el, latest, swap } from "../ui.js";
import { hospitalTable, loadActiveJobs, turnsNow } from "./hospitals.js";

const POLL_SECONDS = 5;
const VERIFY_SECONDS = 60; // the check re-hashes the whole chain: not every 5 s
const ALERT_COUNT = 10;
// Audit actions worth an alert: a failed or skipped turn (details.outcome says which), a failed job.
const ALERT_ACTIONS = ["turn.failed", "job.failed"];

export async function render(root) {
  const stats = el("div", { class: "grid", "data-testid": "overview-stats" });
  const hospitalsBox = el("div", { "data-testid": "overview-hospitals" });
  const jobsBox = el("div", { "data-testid": "overview-jobs" });
  const alertsBox = el("div", { "data-testid": "overview-alerts" });
  const chainValue = el("div", { "data-testid": "audit-chain" });
  const chainCard = el(
    "section",
    { class: "card", "aria-labelledby": "chain-title" },
    el("h2", { id: "chain-title", style: "margin-top: 0" }, "Audit chain"),
    chainValue,
  );
  const alertsSection = el(
    "section",
    { "aria-labelledby": "alerts-title" },
    el("h2", { id: "alerts-title" }, "Recent alerts"),
    alertsBox,
  );
  // Raised only when there is something to say: a hospital reports the audit chain changed
  // behind it, or a queue no live worker consumes (its jobs would wait without a word).
  const warningsBox = el("div", { "data-testid": "overview-warnings" });
  const updated = el("p", { class: "muted" });
  let alertsHidden = false;
  let warningsHidden = false;
  let chainHidden = false;
  let chainCheckedAt = 0;

  root.append(
    el("h1", {}, "Overview"),
    warningsBox,
    stats,
    el(
      "section",
      { "aria-labelledby": "active-jobs-title" },
      el("h2", { id: "active-jobs-title" }, "Running and paused jobs"),
      jobsBox,
    ),
    el(
      "section",
      { "aria-labelledby": "overview-hospitals-title" },
      el("h2", { id: "overview-hospitals-title" }, "Hospitals"),
      hospitalsBox,
    ),
    alertsSection,
    updated,
  );

  // The job rows and the hospitals table from one read: a hospital whose turn runs shows
  // as in its turn in both (the turn's record, not the agent's last heartbeat).
  const refreshHospitals = latest(
    () => Promise.all([apiAll("hospitals/"), loadActiveJobs()]),
    ([hospitals, activeJobs]) => {
      swap(stats, ...statCards(hospitals), chainHidden ? null : chainCard);
      swap(jobsBox, jobTable(activeJobs));
      swap(
        hospitalsBox,
        hospitalTable(hospitals, {
          labelledBy: "overview-hospitals-title",
          withDataset: false,
          turns: turnsNow(activeJobs),
        }),
      );
    },
  );

  const refreshAlerts = latest(
    async () => {
      if (alertsHidden) return null;
      try {
        const pages = await Promise.all(
          ALERT_ACTIONS.map((action) => api("audit/events/", { query: { action, page_size: ALERT_COUNT } })),
        );
        return pages
          .flatMap((page) => page.results || [])
          .sort((a, b) => b.id - a.id)
          .slice(0, ALERT_COUNT);
      } catch (error) {
        if (error instanceof ApiError && error.status === 403) {
          alertsHidden = true;
          alertsSection.remove();
          return null;
        }
        throw error;
      }
    },
    (events) => {
      if (events) swap(alertsBox, alertTable(events));
    },
  );

  async function refreshChain(force = false) {
    if (chainHidden || (!force && Date.now() - chainCheckedAt < VERIFY_SECONDS * 1000)) return;
    chainCheckedAt = Date.now();
    try {
      const result = await api("audit/verify/");
      swap(chainValue, chainResult(result));
    } catch (error) {
      if (error instanceof ApiError && error.status === 403) {
        chainHidden = true;
        chainCard.remove();
        return;
      }
      swap(chainValue, el("p", { class: "muted" }, `Could not check: ${error.message}`));
    }
  }

  function chainResult(result) {
    const again = el(
      "button",
      { type: "button", class: "secondary", "data-testid": "audit-verify-again" },
      "Check again",
    );
    again.addEventListener("click", async () => {
      again.disabled = true;
      await refreshChain(true);
    });
    const checkedAt = new Date().toLocaleTimeString();
    if (result.ok) {
      return el(
        "div",
        {},
        el("p", {}, badge("verifies", "ok")),
        el("p", { class: "muted" }, `${result.checked} event(s) checked at ${checkedAt}.`),
        again,
      );
    }
    const problem = result.problem || {};
    return el(
      "div",
      { role: "alert" },
      el("p", {}, badge("broken", "broken")),
      el(
        "p",
        {},
        problem.message || "The chain does not verify.",
        problem.row_id ? ` (event ${problem.row_id}, ${problem.kind})` : "",
      ),
      el("p", { class: "muted" }, `${result.checked} event(s) matched before it; checked at ${checkedAt}.`),
      again,
    );
  }

  const refreshWarnings = latest(
    async () => {
      if (warningsHidden) return null;
      try {
        const [reports, queues] = await Promise.all([api("audit/witness-reports/"), api("queues/")]);
        return { reports, queues };
      } catch (error) {
        if (error instanceof ApiError && error.status === 403) {
          warningsHidden = true;
          return null;
        }
        throw error;
      }
    },
    (found) => {
      if (found) swap(warningsBox, ...warnings(found));
    },
  );

  async function refreshAll() {
    const results = await Promise.allSettled([
      refreshHospitals(),
      refreshAlerts(),
      refreshChain(),
      refreshWarnings(),
    ]);
    const failed = results.filter((r) => r.status === "rejected");
    updated.textContent = failed.length
      ? `Could not refresh everything (${failed[0].reason?.message}); retrying in ${POLL_SECONDS} s.`
      : `Updated ${new Date().toLocaleTimeString()}; refreshes every ${POLL_SECONDS} s.`;
    return results;
  }

  const [hospitalsLoad] = await refreshAll();
  // Not even the hospitals could be read (no role, signed out): the router shows the error.
  if (hospitalsLoad.status === "rejected") throw hospitalsLoad.reason;
  return poll(POLL_SECONDS, refreshAll);
}

function warnings({ reports, queues }) {
  const cards = [];
  if (reports.length) {
    cards.push(
      el(
        "section",
        { class: "card alert", role: "alert", "data-testid": "witness-reports" },
        el("h2", { style: "margin-top: 0" }, "A hospital says the audit log was rewritten"),
        el(
          "p",
          {},
          "Each hospital keeps the heads of the audit chain it was shown and checks that they are still there. ",
          "These hospitals found one gone: whoever controls this coordinator's database changed its history.",
        ),
        el(
          "ul",
          {},
          reports.map((r) =>
            el(
              "li",
              {},
              el("strong", {}, r.hospital),
              ` (${ago(r.received_at)}): ${r.message} `,
              r.verified ? badge("signed by the hospital", "ok") : badge("signature does not verify", "broken"),
            ),
          ),
        ),
      ),
    );
  }
  const idle = (queues.queues || []).filter((q) => q.consumers === 0);
  if (idle.length) {
    cards.push(
      el(
        "section",
        { class: "card alert", role: "alert", "data-testid": "idle-queues" },
        el("h2", { style: "margin-top: 0" }, "No worker takes these tasks"),
        el(
          "p",
          {},
          "No live worker consumes ",
          idle.map((q) => `"${q.queue}" (${q.waiting ?? "?"} waiting)`).join(", "),
          ": jobs sent there wait until a worker for it starts (see the workers' logs).",
        ),
      ),
    );
  }
  return cards;
}

function statCards(hospitals) {
  const online = hospitals.filter((h) => h.online).length;
  const offline = hospitals.filter((h) => !h.online && h.status === "enrolled").length;
  const waiting = hospitals.filter((h) => h.status === "requested" || h.status === "approved").length;
  const card = (label, value, testid, note) =>
    el(
      "section",
      { class: "card", "data-testid": testid },
      el("h2", { style: "margin-top: 0" }, label),
      el("p", { class: "stat" }, String(value)),
      note ? el("p", { class: "muted" }, note) : null,
    );
  return [
    card("Hospitals online", online, "hospitals-online", `of ${hospitals.length} hospital(s)`),
    card("Hospitals offline", offline, "hospitals-offline", "enrolled but not heard from lately"),
    card("Not enrolled yet", waiting, "hospitals-waiting", "asked to join, or approved without an agent"),
  ];
}

function jobTable(rows) {
  if (!rows.length) return el("p", { class: "muted" }, "No job is running or paused.");
  const columns = ["Job", "State", "Progress", "Taking the turn", "Steps", "Last loss"];
  return el(
    "table",
    { "aria-labelledby": "active-jobs-title" },
    el("thead", {}, el("tr", {}, columns.map((label) => el("th", { scope: "col" }, label)))),
    el(
      "tbody",
      {},
      rows.map(({ job, status }) => {
        const names = Object.fromEntries((job.participants || []).map((p) => [p.hospital, p.hospital_name]));
        const state = status?.state || job.state;
        const rounds = status?.rounds ?? job.rounds;
        const round = status ? status.round : job.current_round;
        const turn = status?.turn;
        return el(
          "tr",
          { "data-testid": `job-row-${job.id}` },
          el(
            "td",
            {},
            el("a", { href: `#/jobs/${job.id}` }, job.name || `Job ${job.id}`),
            el("div", { class: "muted" }, `#${job.id} · ${job.model}`),
          ),
          el("td", {}, badge(state)),
          el("td", {}, progress(round, rounds)),
          el(
            "td",
            {},
            status?.hospital
              ? el(
                  "span",
                  {},
                  el("a", { href: `#/hospitals/${status.hospital}` }, names[status.hospital] || status.hospital),
                  " ",
                  // The same words as the hospitals table, from the same record.
                  turn ? (turn.status === "running" ? badge("in its turn", "busy") : badge(turn.status)) : null,
                  turn && turn.attempt > 1 ? el("span", { class: "muted" }, ` attempt ${turn.attempt}`) : null,
                )
              : el("span", { class: "muted" }, "–"),
          ),
          el(
            "td",
            {},
            turn ? `${turn.steps} this turn` : "–",
            status ? el("div", { class: "muted" }, `${status.totals.steps} in all`) : null,
          ),
          el("td", {}, lossText(status?.last_loss)),
        );
      }),
    ),
  );
}

function progress(round, rounds) {
  if (round === null || round === undefined) return el("span", { class: "muted" }, `not started · ${rounds} round(s)`);
  const label = `round ${round + 1} of ${rounds}`;
  return el(
    "div",
    {},
    el("div", {}, label),
    el("progress", { value: String(round), max: String(Math.max(rounds, 1)), "aria-label": label }),
  );
}

function lossText(loss) {
  if (loss === null || loss === undefined || !Number.isFinite(loss)) return el("span", { class: "muted" }, "–");
  return Math.abs(loss) >= 0.001 ? loss.toFixed(4) : loss.toExponential(2);
}

function alertText(event) {
  const d = event.details || {};
  if (event.action === "job.failed") return ["job failed", "failed", d.reason || ""];
  if (d.outcome === "skipped") return ["hospital skipped", "skipped", d.reason || ""];
  if (d.outcome === "retry") return ["turn failed, retrying", "paused", d.reason || ""];
  return ["turn failed", "failed", d.reason || ""];
}

function alertTable(events) {
  if (!events.length) return el("p", { class: "muted" }, "No failed turn, skipped hospital or failed job.");
  const columns = ["When", "What", "Job", "Hospital", "Why"];
  return el(
    "table",
    { "aria-labelledby": "alerts-title" },
    el("thead", {}, el("tr", {}, columns.map((label) => el("th", { scope: "col" }, label)))),
    el(
      "tbody",
      {},
      events.map((event) => {
        const [what, kind, why] = alertText(event);
        return el(
          "tr",
          { "data-testid": `alert-${event.id}` },
          el("td", { title: event.created_at }, ago(event.created_at)),
          el("td", {}, badge(what, kind)),
          el("td", {}, event.job_id ? el("a", { href: `#/jobs/${event.job_id}` }, `Job ${event.job_id}`) : "–"),
          el("td", {}, event.hospital ? el("a", { href: `#/hospitals/${event.hospital}` }, event.hospital) : "–"),
          el("td", {}, why || el("span", { class: "muted" }, "–")),
        );
      }),
    ),
  );
}
