// The alert a job and a hospital show when a hospital's agent found the server hijacking
// its training (privacy.hijack_detection) and stopped taking part: GET /api/jobs/<id>/ and
// GET /api/hospitals/<slug>/ (hijack_alerts, read from the audit log's
// job.hijack_suspected events).

import { ago, badge, el } from "../ui.js";

/**
 * The alert box for ``alerts`` (empty when there are none).
 * @param {Array<{hospital: string, job: number, turn: number, reason: string, at: string}>} alerts
 * @param {"job" | "hospital"} on which page shows it: a job names the hospitals, a hospital the jobs
 * @param {(slug: string) => string} [hospitalName]
 */
export function hijackAlerts(alerts, on, hospitalName = (slug) => slug) {
  if (!alerts || !alerts.length) return [];
  const who = (a) =>
    on === "job"
      ? el("strong", {}, hospitalName(a.hospital))
      : el("a", { href: `#/jobs/${a.job}` }, `job ${a.job}`);
  return [
    el(
      "div",
      { class: "card hijack-alert", role: "alert", "data-testid": "hijack-alert" },
      el("p", {}, badge("hijacking suspected", "error"), " ", on === "job"
        ? "A hospital found the server's gradients unlike honest training's and stopped taking part in this job."
        : "This hospital found the server's gradients unlike honest training's and stopped taking part."),
      el(
        "ul",
        {},
        alerts.map((a) =>
          el("li", {}, who(a), ` (turn ${a.turn}, ${ago(a.at)}): `, el("span", { class: "problem" }, a.reason)),
        ),
      ),
    ),
  ];
}
