// A Ray cluster as the page says it: the banner while the cluster does not answer, and
// which nodes' samples the machine panel shows (those the pair's runs are on).
// Pure functions, so that tests/unit/test_cluster_js.py runs them in node.

/** Unix seconds -> "14:03:07" in the viewer's time zone. */
export function hhmmss(t) {
  const d = new Date(t * 1000);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map((n) => String(n).padStart(2, "0")).join(":");
}

/** The banner's text while the cluster is unreachable; null while it answers (and always
 * on the local executor). `cluster` as GET /api/health's `cluster`. */
export function clusterBanner(cluster) {
  if (!cluster || cluster.kind !== "ray" || cluster.reachable !== false) return null;
  const since = typeof cluster.since === "number" ? ` since ${hhmmss(cluster.since)}` : "";
  return `The Ray cluster at ${cluster.address || "its address"} is unreachable${since}: `
    + "runs keep training on their nodes; their records catch up when it is back.";
}

/** The newest sample of each node a run is on, in the runs' order, each node once.
 * `samples`: node id -> telemetry record with `node`; `hosts`: each run's host or null. */
export function pairNodes(samples, hosts) {
  const out = [];
  const seen = new Set();
  for (const h of hosts) {
    const id = h && h.node_id;
    if (!id || seen.has(id) || !samples.has(id)) continue;
    seen.add(id);
    out.push(samples.get(id));
  }
  return out;
}
