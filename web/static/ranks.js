// A run of several ranks on its card: one line per rank with its state and its process's
// CPU and memory, from the run view's `ranks` (server/rank_view.py; the state words have
// one home, workers/rank_states.py, and are shown as the API says them). A run of one
// rank has no `ranks`, and its card shows no list.

import * as f from "./format.js";

/** What a rank line says after its state: when a lost rank was noticed, how long a blind
 * launcher's survivor still waits, and its process's CPU and memory while it lives. */
export function rankDetail(r, now = Date.now() / 1000) {
  const parts = [];
  if (r.state === "lost") parts.push(f.isNum(r.at) ? `noticed ${f.clock(r.at)}` : "its process is gone");
  if (r.state === "waiting" && f.isNum(r.until)) {
    const left = Math.max(0, Math.ceil(r.until - now));
    parts.push(`in its collective, times out in ${left} s`);
  }
  if (f.isNum(r.cpu_pct)) parts.push(`${f.pct(r.cpu_pct)} CPU`);
  if (f.isNum(r.rss_bytes)) parts.push(f.bytes(r.rss_bytes));
  if (f.isNum(r.gpu_mem_bytes)) parts.push(`${f.bytes(r.gpu_mem_bytes)} GPU`);
  return parts.join(" · ");
}

/** Show `ranks` (the run view's) in the list `ul`, reusing its items. */
export function showRanks(ul, ranks) {
  const list = Array.isArray(ranks) && ranks.length > 1 ? ranks : [];
  ul.hidden = list.length === 0;
  while (ul.children.length > list.length) ul.lastElementChild.remove();
  list.forEach((r, i) => {
    let li = ul.children[i];
    if (!li) {
      li = document.createElement("li");
      li.innerHTML = `<span class="rank-name"></span> <span class="rank-state"></span> <span class="rank-detail"></span>`;
      ul.append(li);
    }
    if (li.dataset.state !== r.state) li.dataset.state = r.state;
    li.dataset.rank = String(r.rank);
    const set = (sel, text) => {
      const node = li.querySelector(sel);
      if (node.textContent !== text) node.textContent = text;
    };
    set(".rank-name", `rank ${r.rank}`);
    set(".rank-state", r.state);
    set(".rank-detail", rankDetail(r));
    li.title = f.isNum(r.pid) ? `process ${r.pid}` : "";
  });
}
