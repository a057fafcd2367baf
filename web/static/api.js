// HTTP and SSE: the only module that knows URLs. Everything is same-origin; the signed
// session cookie travels by itself.

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

export async function request(method, url, body) {
  const init = { method, headers: { Accept: "application/json" }, credentials: "same-origin" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(url, init);
  } catch (e) {
    throw new ApiError(0, `the server did not answer (${e.message})`);
  }
  const text = await res.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!res.ok) {
    const detail = data && typeof data.detail === "string" ? data.detail : `${res.status} ${res.statusText}`;
    throw new ApiError(res.status, detail);
  }
  return data;
}

const enc = encodeURIComponent;
let recordKinds = null; // the promise of GET /api/record-kinds

export const api = {
  presets: () => request("GET", "/api/presets"),
  /** Whether the lab is ready, and whether its warm trainer process is (warm_trainers). */
  health: () => request("GET", "/api/health"),
  createPair: (preset, overrides) => request("POST", "/api/pairs",
    overrides && Object.keys(overrides).length ? { preset, overrides } : { preset }),
  /** One lesson; `query` ("?steps=600") sets unlocked settings, validated by the server. */
  lesson: (id, query = "") => request("GET", `/api/presets/${enc(id)}${query}`),
  pair: (id) => request("GET", `/api/pairs/${enc(id)}`),
  /** The owner's prediction: {answers: {A: 40, B: 150}} or {skip: true}. */
  predict: (pair, body) => request("POST", `/api/pairs/${enc(pair)}/prediction`, body),
  /** Hold both training runs where they are (true) while the question is open, or not. */
  hold: (pair, hold) => request("POST", `/api/pairs/${enc(pair)}/hold`, { hold }),
  /** Stop both runs of a pair for good (frees the owner's quota). */
  stopPair: (pair) => request("POST", `/api/pairs/${enc(pair)}/stop`),
  /** Crash test; `mode`: a crash mode the lesson offers besides its own (null: its own). */
  crash: (run, mode = null) => request("POST", `/api/runs/${enc(run)}/crash`, mode ? { crash_mode: mode } : undefined),
  preempt: (run) => request("POST", `/api/runs/${enc(run)}/preempt`),
  resumeChecks: (run) => request("GET", `/api/runs/${enc(run)}/resume-checks`),
  /** The server's machine sample; with a pair, also its Ray nodes' and the cluster's state. */
  machine: (pairId) => request("GET", pairId ? `/api/machine?pair=${enc(pairId)}` : "/api/machine"),
  /** The run-record contract (every kind and its fields); asked once a page. */
  recordKinds: () => (recordKinds ||= request("GET", "/api/record-kinds").catch((e) => {
    recordKinds = null;
    throw e;
  })),

  /** Every record of a run with id > after, page by page; calls onPage(records) per page. */
  async records(run, after, onPage, limit = 5000) {
    let cursor = after;
    for (;;) {
      const page = await request("GET", `/api/runs/${enc(run)}/records?after=${cursor}&limit=${limit}`);
      if (page.records.length) onPage(page.records);
      if (page.records.length < limit || page.next_after <= cursor) return page.next_after;
      cursor = page.next_after;
    }
  },
};

/** Follow /api/stream?pair=ID. `handlers` has hello, records, run, resume_checks, telemetry,
 * and status(state) with "live" | "reconnecting". EventSource reconnects by itself (and
 * the server backfills from Last-Event-ID); when it gives up we open a new one with
 * backoff and call handlers.reopened() so the page refetches what it missed. */
export function followStream(pairId, handlers) {
  let source = null;
  let delay = 1000;
  let stopped = false;
  let timer = null;
  const events = ["hello", "records", "run", "resume_checks", "telemetry"];

  function open(reopened) {
    if (stopped) return;
    source = new EventSource(`/api/stream?pair=${enc(pairId)}`);
    for (const name of events) {
      source.addEventListener(name, (ev) => {
        let data;
        try {
          data = JSON.parse(ev.data);
        } catch {
          return;
        }
        if (handlers[name]) handlers[name](data);
      });
    }
    source.addEventListener("open", () => {
      delay = 1000;
      handlers.status?.("live");
      if (reopened) handlers.reopened?.();
      reopened = false;
    });
    source.addEventListener("error", () => {
      if (stopped) return;
      handlers.status?.("reconnecting");
      if (source.readyState === EventSource.CLOSED) {
        source = null;
        timer = setTimeout(() => open(true), delay);
        delay = Math.min(delay * 2, 15000);
      }
    });
  }

  open(false);
  return {
    close() {
      stopped = true;
      clearTimeout(timer);
      if (source) source.close();
    },
  };
}
