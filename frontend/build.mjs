// Copies the pinned third-party scripts the dashboard uses into vendor/, which the
// coordinator serves next to src/ (hospital networks are often closed: no CDN).
import { copyFileSync, mkdirSync } from "node:fs";

const files = [["node_modules/chart.js/dist/chart.umd.min.js", "vendor/chart.umd.min.js"]];
mkdirSync("vendor", { recursive: true });
for (const [from, to] of files) {
  copyFileSync(from, to);
  console.log(`vendored ${from} -> ${to}`);
}
