// Sparklines of an instance's memory and CPU, from the figures the listing already has (sampled
// on each refresh). Pure cores (`Series`, `points`) plus one SVG builder; no link, no script, no
// style attribute (the page's Content-Security-Policy allows none of them).

/** The last `max` samples of one instance: time (ms), RSS (bytes), CPU time (ms). */
export class Series {
  private readonly samples: { t: number; rss: number | null; cpuMs: number | null }[] = [];

  constructor(private readonly max = 60) {}

  push(t: number, rss: number | null | undefined, cpuMs: number | null | undefined): void {
    const last = this.samples[this.samples.length - 1];
    if (last && t <= last.t) return;
    this.samples.push({ t, rss: rss ?? null, cpuMs: cpuMs ?? null });
    if (this.samples.length > this.max) this.samples.shift();
  }

  /** RSS of each sample that has one. */
  memory(): number[] {
    return this.samples.flatMap((s) => (s.rss == null ? [] : [s.rss]));
  }

  /** CPU use between consecutive samples, in cores (1 = one core busy). */
  cpu(): number[] {
    const out: number[] = [];
    for (let i = 1; i < this.samples.length; i++) {
      const a = this.samples[i - 1];
      const b = this.samples[i];
      if (a.cpuMs == null || b.cpuMs == null || b.t <= a.t) continue;
      out.push(Math.max(0, b.cpuMs - a.cpuMs) / (b.t - a.t));
    }
    return out;
  }
}

/** The polyline points of `values` in a `width`×`height` box (the top is the maximum, at least
 *  `floor`), or "" with fewer than two values. */
export function points(values: number[], width: number, height: number, floor = 0): string {
  if (values.length < 2) return "";
  const top = Math.max(floor, ...values);
  const step = width / (values.length - 1);
  return values
    .map((v, i) => {
      const y = top > 0 ? height - (v / top) * height : height;
      return `${(i * step).toFixed(1)},${y.toFixed(1)}`;
    })
    .join(" ");
}

const SVG = "http://www.w3.org/2000/svg";

/** A small SVG sparkline with its label for assistive technology. */
export function sparkline(values: number[], label: string, testId: string, floor = 0): SVGSVGElement {
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", "0 0 80 20");
  svg.setAttribute("width", "80");
  svg.setAttribute("height", "20");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", label);
  svg.setAttribute("data-testid", testId);
  svg.setAttribute("data-samples", String(values.length));
  const title = document.createElementNS(SVG, "title");
  title.textContent = label;
  svg.append(title);
  const line = document.createElementNS(SVG, "polyline");
  line.setAttribute("points", points(values, 80, 18, floor));
  line.setAttribute("fill", "none");
  line.setAttribute("stroke", "currentColor");
  line.setAttribute("stroke-width", "1.5");
  svg.append(line);
  return svg;
}
