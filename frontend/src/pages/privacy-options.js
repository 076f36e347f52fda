// The new-job form's privacy section: each measurement and defense of a job's
// ``privacy`` option (medsplit/defenses/options.py), off unless ticked, with its settings.
// The server checks them (and which fit the mode) and names every problem under
// ``privacy``, shown at the top of this section.

import { el, field } from "../ui.js";

// Each part: its key, its label, one sentence on what it does, its settings with their
// defaults (as options.py has them).
const PARTS = [
  {
    key: "audit",
    label: "Privacy audit at each hospital",
    help:
      "After its turn (every N rounds, and after the last), each hospital inverts the job's front on its own " +
      "data and reports only the numbers: inversion SSIM and PSNR, distance correlation, label-leakage AUC. " +
      "The pictures stay at the hospital.",
    settings: [
      { name: "every_rounds", label: "Every N rounds", value: 1, min: 1, step: "1" },
      { name: "decoder_steps", label: "Inverse network's steps", value: 300, min: 1, step: "1" },
      { name: "records", label: "Records used (at most)", value: 1024, min: 16, step: "1" },
    ],
  },
  {
    key: "activation_noise",
    label: "Noise on activations (Gaussian mechanism, ε accounted)",
    help:
      "Each record's activations are clipped, then noised; batches are drawn by Poisson sampling and the ε " +
      "spent over the whole job is accounted (opacus' RDP accountant). Give the noise, or the ε to spend.",
    settings: [
      { name: "clip_norm", label: "Clip norm", value: 1.0, min: 0, step: "any" },
      { name: "target_epsilon", label: "Target ε (blank: give the noise)", value: 8.0, min: 0, step: "any" },
      { name: "noise_multiplier", label: "Noise multiplier (blank: from the target)", value: "", min: 0, step: "any" },
      { name: "delta", label: "δ", value: 1e-5, min: 0, step: "any" },
    ],
  },
  {
    key: "nopeek",
    label: "NoPeek (distance correlation in the loss)",
    help: "Adds the distance correlation of inputs and activations, with this weight, to the front's training.",
    settings: [{ name: "weight", label: "Weight", value: 0.1, min: 0, step: "any" }],
  },
  {
    key: "label_noise",
    label: "Randomised response on labels (labels at the server)",
    help: "Each label sent to the server is kept with probability e^ε / (e^ε + K − 1): label-DP at ε.",
    settings: [{ name: "epsilon", label: "ε", value: 2.0, min: 0, step: "any" }],
  },
  {
    key: "gradient_noise",
    label: "Gradient noise (labels at the hospital)",
    help: "Noise on the gradients a hospital holding the labels sends up, against the norm and cosine attacks.",
    settings: [{ name: "scale", label: "Scale (of the gradient's norm)", value: 0.5, min: 0, step: "any" }],
  },
  {
    key: "hijack_detection",
    label: "Hijack detection",
    help: "Each hospital checks the gradients it receives for a server steering its layers, and stops if it finds one.",
    settings: [
      { name: "method", label: "Method", value: "splitout", choices: ["splitout", "splitguard"] },
      { name: "honest_records", label: "Honest records (splitout)", value: 256, min: 16, step: "1" },
      { name: "probe_probability", label: "Probe probability (splitguard)", value: 0.1, min: 0, step: "any" },
    ],
  },
];

/** The section and its value: ``{node, value()}``, ``value()`` the ``privacy`` object
 * (only the ticked parts; a blank setting takes the server's default). */
export function privacyOptions() {
  const parts = PARTS.map((part) => {
    const toggle = el("input", { type: "checkbox", name: `privacy_${part.key}`, id: `f-privacy-${part.key}` });
    const inputs = part.settings.map((s) => {
      const input = s.choices
        ? el(
            "select",
            { name: `privacy_${part.key}_${s.name}` },
            s.choices.map((c) => el("option", { value: c, selected: c === s.value }, c)),
          )
        : el("input", {
            name: `privacy_${part.key}_${s.name}`,
            type: "number",
            inputmode: s.step === "1" ? "numeric" : "decimal",
            min: s.min,
            step: s.step,
            value: s.value,
          });
      return { setting: s, input };
    });
    const settingsBox = el(
      "div",
      { class: "row", hidden: true },
      inputs.map(({ setting, input }) => field(setting.label, input)),
    );
    toggle.addEventListener("change", () => {
      settingsBox.hidden = !toggle.checked;
    });
    const node = el(
      "div",
      { class: "privacy-part", "data-testid": `privacy-${part.key}` },
      el("label", { for: toggle.id }, toggle, " ", part.label),
      el("p", { class: "help" }, part.help),
      settingsBox,
    );
    return { part, toggle, inputs, node };
  });
  const node = el(
    "fieldset",
    { class: "field", "data-field": "privacy", "aria-describedby": "privacy-error" },
    el("legend", {}, "Privacy: measurements and defenses"),
    el("p", { class: "field-error", id: "privacy-error", role: "alert" }),
    el(
      "p",
      { class: "help" },
      "All off by default; with all off the job is exact (it equals unsplit training). A defense changes what " +
        "crosses the cut, at a cost in accuracy the audit and the benchmarks show.",
    ),
    parts.map((p) => p.node),
  );
  function value() {
    const out = {};
    for (const { part, toggle, inputs } of parts) {
      if (!toggle.checked) continue;
      const settings = {};
      for (const { setting, input } of inputs) {
        const text = input.value.trim();
        if (text === "") continue;
        const number = Number(text);
        settings[setting.name] = setting.choices ? text : Number.isFinite(number) ? number : text;
      }
      out[part.key] = settings;
    }
    return out;
  }
  return { node, value };
}
