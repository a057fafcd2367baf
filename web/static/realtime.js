// Live updates of one pair, from Supabase Realtime or from the server's SSE stream.
//
// The server says in <script id="lab-config"> whether Realtime is on (project URL, the
// public anon key, the topic prefix; never a secret). When it is, and supabase-js loaded
// (web/static/vendor/supabase.js), the page joins the pair's Broadcast channel: one
// "batch" message per tick carries new records, run states, resume checks and the machine
// sample, dispatched to the same handlers as the SSE events. Otherwise, and as soon as
// Realtime fails (join refused or timed out, channel error, the socket gone, or silence
// while a run is live), the page follows the SSE stream, which the server always serves,
// and resyncs from its last record ids (handlers.reopened) the way it does after an SSE
// gap. Records may arrive twice around a switch: the model dedupes by id.

import { followStream } from "./api.js";

const JOIN_TIMEOUT_MS = 10000;
const WATCH_EVERY_MS = 2000;

/** The page config the server rendered into index.html ({} when there is none). */
export function labConfig() {
  try {
    return JSON.parse(document.getElementById("lab-config")?.textContent || "{}") || {};
  } catch {
    return {};
  }
}

/** Follow a pair live. `handlers` as for followStream, plus status(state, transport) with
 * transport "realtime" | "sse", and live() → true while some run may still change.
 * Returns {close(), transport}. */
export function followLive(pairId, handlers) {
  const rt = labConfig().realtime;
  if (!rt) return viaSse(pairId, handlers, false);
  if (!window.supabase?.createClient) {
    console.warn("crashdrill: Realtime is configured but supabase-js is missing; using SSE");
    return viaSse(pairId, handlers, false);
  }
  return viaRealtime(pairId, handlers, rt);
}

function viaSse(pairId, handlers, resync) {
  let first = true;
  const stream = followStream(pairId, {
    ...handlers,
    hello: (d) => {
      handlers.hello?.(d);
      // After a switch from Realtime: fetch what went by, once the stream is subscribed.
      if (resync && first) handlers.reopened?.();
      first = false;
    },
    status: (s) => {
      if (s === "live") document.body.dataset.liveTransport = "sse";
      handlers.status?.(s, "sse");
    },
  });
  return { close: () => stream.close(), transport: "sse" };
}

function viaRealtime(pairId, handlers, rt) {
  const state = { transport: "realtime", close };
  let client = null;
  let channel = null;
  let sse = null;
  let closed = false;
  let subscribed = false;
  let lastSeq = null;
  let lastAt = performance.now();
  let joinTimer = null;
  let watch = null;

  function teardown() {
    clearTimeout(joinTimer);
    clearInterval(watch);
    const c = client;
    client = null;
    if (c) {
      try {
        c.removeAllChannels().finally(() => c.realtime?.disconnect());
      } catch {
        /* already gone */
      }
    }
  }

  function fallBack(reason) {
    if (closed || sse) return;
    console.warn(`crashdrill: following the server's SSE stream instead of Realtime (${reason})`);
    teardown();
    state.transport = "sse";
    document.body.dataset.liveFallback = reason;
    handlers.status?.("reconnecting", "sse");
    sse = viaSse(pairId, handlers, true);
  }

  function close() {
    closed = true;
    teardown();
    sse?.close();
  }

  function onBatch(batch) {
    if (closed || sse || !batch || batch.pair !== pairId) return;
    lastAt = performance.now();
    // A batch went missing (seq jumped, or the server restarted): resync from the API.
    const missed = lastSeq !== null && batch.seq !== lastSeq + 1;
    lastSeq = batch.seq;
    let stale = missed;
    for (const r of batch.runs || []) {
      if (r.view) handlers.run?.(r.view);
      if ((r.records && r.records.length) || r.gap) {
        handlers.records?.({ run: r.run, gap: !!r.gap, records: r.records || [] });
      }
      if (r.checks) handlers.resume_checks?.(r.checks);
      if (r.stale) stale = true;
    }
    if (batch.telemetry) handlers.telemetry?.(batch.telemetry);
    if (stale) handlers.reopened?.();
  }

  try {
    client = window.supabase.createClient(rt.url, rt.key, {
      auth: { persistSession: false, autoRefreshToken: false, detectSessionInUrl: false },
    });
    channel = client.channel(rt.topic_prefix + pairId, {
      config: { private: !!rt.private, broadcast: { self: false, ack: false } },
    });
    channel.on("broadcast", { event: rt.event }, (message) => onBatch(message.payload));
    joinTimer = setTimeout(() => fallBack("Realtime did not answer the join"), JOIN_TIMEOUT_MS);
    channel.subscribe((status, err) => {
      if (closed || sse) return;
      if (status === "SUBSCRIBED") {
        clearTimeout(joinTimer);
        subscribed = true;
        lastAt = performance.now();
        document.body.dataset.liveTransport = "realtime";
        handlers.status?.("live", "realtime");
        handlers.reopened?.(); // what happened before the join
      } else if (status === "CHANNEL_ERROR" || status === "TIMED_OUT" || status === "CLOSED") {
        fallBack(`Realtime ${status}${err?.message ? `: ${err.message}` : ""}`);
      }
    });
  } catch (e) {
    fallBack(`Realtime failed to start: ${e.message}`);
    return state;
  }
  const silenceMs = (rt.silence_s || 35) * 1000;
  watch = setInterval(() => {
    if (!subscribed || sse || closed) return;
    if (handlers.live?.() !== false && performance.now() - lastAt > silenceMs) {
      fallBack("no Realtime message while a run is live");
    }
  }, WATCH_EVERY_MS);
  return state;
}
