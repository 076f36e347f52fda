// The job page's privacy panel: what each hospital measured of its own exposure, per
// round (GET /api/jobs/<id>/privacy/: a hospital admin gets their own hospital's only).
// Each figure with one sentence on what it means and where the attack or the accounting
// comes from. Only these numbers reach the coordinator; the pictures stay at the hospitals.

import { el, swap, table } from "../ui.js";

// What each figure means, and its reference.
export const MEANINGS = [
  {
    key: "ssim",
    label: "Inversion SSIM",
    text:
      "How alike the images an attacker rebuilds from this hospital's activations are to the originals " +
      "(beside it, the same for the average image: what knowing nothing gets): 1 = the images come back, " +
      "below about 0.3 unrecognisable.",
    ref: "He, Zhang and Lee, Model inversion attacks against collaborative inference, ACSAC 2019",
  },
  {
    key: "psnr",
    label: "Inversion PSNR",
    text: "The rebuilt images' peak signal-to-noise ratio in dB: higher = closer to the originals.",
    ref: "He et al. 2019 (the same attack)",
  },
  {
    key: "distance_correlation",
    label: "Distance correlation",
    text:
      "How much the activations depend on the inputs: 0 = independent, 1 = one determines the other. " +
      "NoPeek trains it down.",
    ref: "Székely, Rizzo and Bakirov, Ann. Statist. 2007; Vepakomma et al., NoPeek, 2020",
  },
  {
    key: "norm_auc",
    label: "Label-leak AUC",
    text:
      "How well the norm and cosine attacks guess each record's label from the gradients the hospital sent up " +
      "(only where labels stay at the hospital): 0.5 = chance, 1.0 (or 0.0) = every label.",
    ref: "Li et al., Label leakage and protection in two-party split learning, ICLR 2022",
  },
  {
    key: "epsilon",
    label: "ε spent",
    text:
      "The differential-privacy budget the activation noise has spent so far over the job, against the " +
      "job's target, at δ: smaller = a stronger guarantee about any one record.",
    ref: "Abadi et al., Deep learning with differential privacy, CCS 2016; Mironov, Rényi DP, CSF 2017",
  },
];

const three = (v) => (v === null || v === undefined ? "–" : v.toFixed(3));

function aucText(row) {
  if (row.label_records === null || row.label_records === undefined) return "–";
  return `${three(row.norm_auc)} / ${three(row.cosine_auc)}`;
}

function epsilonText(row) {
  if (row.epsilon === null || row.epsilon === undefined) return "–";
  const target = row.target_epsilon === null || row.target_epsilon === undefined ? "" : ` of ${row.target_epsilon}`;
  const delta = row.delta_total ?? row.delta;
  return `${row.epsilon.toFixed(2)}${target} (δ ${delta === null || delta === undefined ? "–" : delta.toExponential(1)})`;
}

/** Whether ``job`` (GET /api/jobs/<id>/) measures anything the panel shows. */
export function measuresPrivacy(job) {
  const privacy = job?.description?.privacy || {};
  return Boolean(privacy.audit || privacy.activation_noise);
}

/** The panel: ``{heading, box, draw(job, rows)}``. */
export function privacyPanel(hospitalName, hospitalLink) {
  const heading = el("h2", { hidden: true }, "Privacy");
  const box = el("div", { class: "job-privacy", "data-testid": "privacy" });
  function draw(job, rows) {
    const shown = measuresPrivacy(job);
    heading.hidden = !shown;
    if (!shown) return box.replaceChildren();
    const sorted = [...(rows || [])].sort((a, b) => a.round - b.round || a.hospital.localeCompare(b.hospital));
    swap(
      box,
      el(
        "p",
        { class: "muted" },
        "What each hospital measured of its own exposure, on its own data, with the job's front as it stood after " +
          "its turn. Only these numbers left the hospital; its pictures of the reconstructions stay there.",
      ),
      table(
        [
          { label: "Round", value: (r) => r.round + 1 },
          { label: "Hospital", value: (r) => hospitalLink(r.hospital, hospitalName(r.hospital)) },
          {
            label: "Inversion SSIM",
            value: (r) => (r.ssim === null ? "–" : `${three(r.ssim)} (average image ${three(r.baseline_ssim)})`),
          },
          { label: "PSNR (dB)", value: (r) => (r.psnr === null ? "–" : r.psnr.toFixed(1)) },
          { label: "Distance correlation", value: (r) => three(r.distance_correlation) },
          { label: "Label-leak AUC (norm / cosine)", value: aucText },
          { label: "ε spent (of target)", value: epsilonText },
        ],
        sorted,
        { empty: "No figures yet: each hospital reports after its turn.", caption: "Privacy figures per hospital and round" },
      ),
      el(
        "dl",
        { class: "privacy-meanings", "data-testid": "privacy-meanings" },
        MEANINGS.flatMap((m) => [el("dt", {}, m.label), el("dd", {}, m.text, " ", el("cite", {}, m.ref))]),
      ),
    );
  }
  return { heading, box, draw };
}
