// Number and text formats of the lab page, as the seed lab prints them:
// 0.0e+0, 360.9 MB, 33k tokens/s, 5.5%, 24,576,000, 0:08:07.

const DASH = "–";

export const isNum = (x) => typeof x === "number" && Number.isFinite(x);

/** 1234567 -> "1,234,567". */
export function int(x) {
  return isNum(x) ? Math.round(x).toLocaleString("en-US") : DASH;
}

/** Losses: 3 decimals (4.869). */
export function loss(x) {
  return isNum(x) ? x.toFixed(3) : DASH;
}

/** Scientific with one decimal, as JS writes it: 0.0e+0, 1.0e-4, 3.2e-7. */
export function sci(x) {
  return isNum(x) ? x.toExponential(1) : DASH;
}

/** A fraction 0..1 as a percentage with one decimal: 0.055 -> "5.5%". */
export function pctOfFraction(x) {
  return isNum(x) ? `${(x * 100).toFixed(1)}%` : DASH;
}

/** Already a percentage: 42.37 -> "42%". */
export function pct(x, digits = 0) {
  return isNum(x) ? `${x.toFixed(digits)}%` : DASH;
}

/** Decimal bytes: 360.9 MB, 6.4 GB, 512 B. */
export function bytes(x) {
  if (!isNum(x)) return DASH;
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  let v = Math.abs(x);
  while (v >= 1000 && i < units.length - 1) {
    v /= 1000;
    i += 1;
  }
  const s = i === 0 ? String(Math.round(v)) : v.toFixed(1);
  return `${x < 0 ? "-" : ""}${s} ${units[i]}`;
}

/** Whole units for a capacity next to a reading: 22 GB (never 22.5 GB when it is 22.49). */
export function bytesRound(x) {
  if (!isNum(x)) return DASH;
  const gb = x / 1e9;
  return gb >= 1 ? `${Math.round(gb)} GB` : bytes(x);
}

/** Rates per second: 1.2 MB/s. */
export function rate(x) {
  return isNum(x) ? `${bytes(x)}/s` : DASH;
}

/** Tokens per second: 33k, 1.2M, 950. */
export function compact(x) {
  if (!isNum(x)) return DASH;
  const a = Math.abs(x);
  if (a >= 1e9) return `${(x / 1e9).toFixed(a >= 1e10 ? 0 : 1)}G`;
  if (a >= 1e6) return `${(x / 1e6).toFixed(a >= 1e7 ? 0 : 1)}M`;
  if (a >= 1e3) return `${(x / 1e3).toFixed(a >= 1e4 ? 0 : 1)}k`;
  return String(Math.round(x));
}

/** Parameters: 120576 -> "0.12M", 30.06e6 -> "30M". */
export function params(x) {
  if (!isNum(x)) return DASH;
  if (x >= 1e9) return `${(x / 1e9).toFixed(1)}B`;
  if (x >= 1e7) return `${Math.round(x / 1e6)}M`;
  if (x >= 1e6) return `${(x / 1e6).toFixed(1)}M`;
  return `${(x / 1e6).toFixed(2)}M`;
}

/** Seconds as h:mm:ss. */
export function duration(s) {
  if (!isNum(s) || s < 0) return DASH;
  const t = Math.floor(s);
  const h = Math.floor(t / 3600);
  const m = Math.floor((t % 3600) / 60);
  const sec = t % 60;
  return `${h}:${String(m).padStart(2, "0")}:${String(sec).padStart(2, "0")}`;
}

/** Dollars the seed's way: "<$0.01", "$0.04", "$1.20". */
export function usd(x) {
  if (!isNum(x)) return DASH;
  if (x === 0) return "$0.00";
  if (x < 0.01) return "<$0.01";
  return `$${x.toFixed(2)}`;
}

/** kWh with three decimals: 0.020 kWh; tiny values in Wh. */
export function kwh(x) {
  if (!isNum(x)) return DASH;
  if (x > 0 && x < 0.001) return `${(x * 1000).toFixed(2)} Wh`;
  return `${x.toFixed(3)} kWh`;
}

export function watts(x) {
  return isNum(x) ? `${Math.round(x)} W` : DASH;
}

/** Unix seconds -> "09:49:18 AM" in the viewer's time zone. */
export function clock(t) {
  if (!isNum(t)) return DASH;
  return new Date(t * 1000).toLocaleTimeString("en-US", {
    hour: "2-digit",
    minute: "2-digit",
    second: "2-digit",
  });
}

/** "just now", "12 s ago", "3 min ago". */
export function ago(t, now = Date.now() / 1000) {
  if (!isNum(t)) return DASH;
  const d = Math.max(0, now - t);
  if (d < 5) return "just now";
  if (d < 90) return `${Math.round(d)} s ago`;
  return `${Math.round(d / 60)} min ago`;
}

export { DASH };

/** A short time to wait: 0.4 s, 12 s, 3 min. */
export function seconds(x) {
  if (!isNum(x)) return DASH;
  if (x < 10) return `${x.toFixed(1)} s`;
  if (x < 90) return `${Math.round(x)} s`;
  return `${Math.round(x / 60)} min`;
}
