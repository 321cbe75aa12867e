// Small hand-drawn canvas charts for the scheduler panel. Each function redraws a whole chart; they are
// cheap enough to call on every stats event (about twice a second).

const cssCache = new Map();

/** A colour (or any value) from the page's CSS custom properties, so charts follow the theme. */
export function cssVar(name) {
  if (!cssCache.has(name)) {
    cssCache.set(name, getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#888");
  }
  return cssCache.get(name);
}

export function forgetColors() {
  cssCache.clear();
}

/** Size the backing store to the element's CSS size times the device pixel ratio. */
function prepare(canvas) {
  const dpr = window.devicePixelRatio || 1;
  const w = Math.max(1, canvas.clientWidth);
  const h = Math.max(1, canvas.clientHeight);
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const g = canvas.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  return { g, w, h };
}

/** A "nice" upper bound for an axis: 1, 2 or 5 times a power of ten. */
export function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

function placeholder(g, w, h, text) {
  g.fillStyle = cssVar("--muted");
  g.font = "11px system-ui, sans-serif";
  g.textAlign = "center";
  g.textBaseline = "middle";
  const x = (PAD.l + w - PAD.r) / 2;
  const tw = g.measureText(text).width;
  g.clearRect(x - tw / 2 - 6, h / 2 - 8, tw + 12, 16);
  g.fillText(text, x, h / 2);
}

function fmtAxis(v, unit) {
  if (unit === "%") return `${Math.round(v * 100)}%`;
  if (v >= 10000) return `${Math.round(v / 1000)}k`;
  if (v >= 1000) return `${(v / 1000).toFixed(1)}k`;
  return Number.isInteger(v) ? String(v) : v.toFixed(1);
}

const PAD = { l: 30, r: 6, t: 7, b: 6 };

/** Draws the horizontal grid with its labels and returns the left edge of the plot area. */
function grid(g, w, h, max, unit) {
  g.font = "10px system-ui, sans-serif";
  const labels = [0, 0.5, 1].map((f) => fmtAxis(max * f, unit));
  PAD.l = Math.ceil(Math.max(...labels.map((t) => g.measureText(t).width))) + 10;
  const x0 = PAD.l;
  const y0 = PAD.t;
  const ih = h - PAD.t - PAD.b;
  g.textAlign = "right";
  g.textBaseline = "middle";
  [0, 0.5, 1].forEach((f, i) => {
    const y = Math.round(y0 + ih * (1 - f)) + 0.5;
    g.strokeStyle = cssVar("--grid");
    g.lineWidth = 1;
    g.beginPath();
    g.moveTo(x0, y);
    g.lineTo(w - PAD.r, y);
    g.stroke();
    g.fillStyle = cssVar("--muted");
    g.fillText(labels[i], x0 - 4, y);
  });
  return x0;
}

/**
 * Lines over a fixed number of slots (newest at the right).
 * @param {HTMLCanvasElement} canvas
 * @param {{series: {values: number[], color: string, fill?: boolean, width?: number}[], slots: number,
 *          max?: number, unit?: string}} spec
 */
export function lineChart(canvas, spec) {
  const { g, w, h } = prepare(canvas);
  let max = spec.max;
  if (max === undefined) {
    let m = 0;
    for (const s of spec.series) for (const v of s.values) if (v > m) m = v;
    max = niceMax(m);
  }
  grid(g, w, h, max, spec.unit);
  if (spec.series.every((s) => s.values.length === 0)) placeholder(g, w, h, spec.empty || "waiting for data");
  const iw = w - PAD.l - PAD.r;
  const ih = h - PAD.t - PAD.b;
  const dx = iw / Math.max(1, spec.slots - 1);
  for (const s of spec.series) {
    const n = s.values.length;
    if (n === 0) continue;
    const xs = (i) => PAD.l + iw - (n - 1 - i) * dx;
    const ys = (v) => PAD.t + ih * (1 - Math.min(1, Math.max(0, v / max)));
    g.beginPath();
    for (let i = 0; i < n; i++) {
      const x = xs(i);
      const y = ys(s.values[i]);
      if (i === 0) g.moveTo(x, y);
      else g.lineTo(x, y);
    }
    g.strokeStyle = s.color;
    g.lineWidth = s.width || 1.6;
    g.lineJoin = "round";
    g.stroke();
    if (s.fill) {
      g.lineTo(xs(n - 1), PAD.t + ih);
      g.lineTo(xs(0), PAD.t + ih);
      g.closePath();
      g.globalAlpha = 0.14;
      g.fillStyle = s.color;
      g.fill();
      g.globalAlpha = 1;
    }
  }
}

/**
 * Stacked columns, one per step (newest at the right), with an optional limit line.
 * @param {{bars: number[][], colors: string[], slots: number, limit?: number}} spec
 */
export function stackedBars(canvas, spec) {
  const { g, w, h } = prepare(canvas);
  let m = 0;
  for (const b of spec.bars) m = Math.max(m, b.reduce((a, v) => a + v, 0));
  // The limit line joins the scale only when it is near the data; far above, it would flatten the bars.
  const max = niceMax(Math.max(m, spec.limit && spec.limit <= m * 2 ? spec.limit : 0, 1));
  grid(g, w, h, max);
  if (spec.bars.length === 0) placeholder(g, w, h, spec.empty || "no steps yet");
  const iw = w - PAD.l - PAD.r;
  const ih = h - PAD.t - PAD.b;
  const slot = iw / spec.slots;
  const bw = Math.max(1, slot * 0.72);
  const n = spec.bars.length;
  for (let i = 0; i < n; i++) {
    const x = PAD.l + iw - (n - i) * slot + (slot - bw) / 2;
    let base = PAD.t + ih;
    spec.bars[i].forEach((v, k) => {
      if (!(v > 0)) return;
      const bh = Math.max(2, (ih * v) / max);
      g.fillStyle = spec.colors[k];
      g.fillRect(x, base - bh, bw, bh);
      base -= bh;
    });
  }
  if (spec.limit && spec.limit <= max) {
    const y = Math.round(PAD.t + ih * (1 - spec.limit / max)) + 0.5;
    g.strokeStyle = cssVar("--c-limit");
    g.setLineDash([4, 3]);
    g.lineWidth = 1.2;
    g.beginPath();
    g.moveTo(PAD.l, y);
    g.lineTo(w - PAD.r, y);
    g.stroke();
    g.setLineDash([]);
  } else if (spec.limit) {
    g.fillStyle = cssVar("--c-limit");
    g.font = "10px system-ui, sans-serif";
    g.textAlign = "right";
    g.textBaseline = "top";
    g.fillText(`limit ${spec.limit} \u2191`, w - PAD.r, 1);
  }
}

/**
 * Deadline outcomes: a proportion bar of met vs missed, and under it one tick per recent turn.
 * @param {{hit: number, miss: number, recent: boolean[]}} spec
 */
export function deadlineChart(canvas, spec) {
  const { g, w, h } = prepare(canvas);
  const total = spec.hit + spec.miss;
  const x0 = 4;
  const bw = w - 8;
  const barH = Math.min(14, h / 2 - 4);
  const r = barH / 2;
  const y = 4;
  const round = (x, yy, ww, hh, rad) => {
    g.beginPath();
    if (g.roundRect) g.roundRect(x, yy, ww, hh, rad);
    else g.rect(x, yy, ww, hh);
  };
  round(x0, y, bw, barH, r);
  g.fillStyle = cssVar("--grid");
  g.fill();
  if (total > 0) {
    g.save();
    round(x0, y, bw, barH, r);
    g.clip();
    const hw = (bw * spec.hit) / total;
    g.fillStyle = cssVar("--c-hit");
    g.fillRect(x0, y, hw, barH);
    g.fillStyle = cssVar("--c-miss");
    g.fillRect(x0 + hw, y, bw - hw, barH);
    g.restore();
  }
  // Recent turns, oldest at the left.
  const ticks = spec.recent.slice(-60);
  const ty = y + barH + 8;
  const th = Math.max(6, h - ty - 4);
  const tw = Math.min(10, bw / 60);
  ticks.forEach((ok, i) => {
    g.fillStyle = cssVar(ok ? "--c-hit" : "--c-miss");
    g.fillRect(x0 + i * (tw + 2), ty, tw, th);
  });
  if (ticks.length === 0) {
    g.fillStyle = cssVar("--muted");
    g.font = "11px system-ui, sans-serif";
    g.textBaseline = "top";
    g.textAlign = "left";
    g.fillText("no turns yet", x0, ty);
  }
}
