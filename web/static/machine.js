// "The machine, live": the newest telemetry sample as tiles, each with a line saying what
// moves it; a last-5-minutes sparkline; and this experiment's energy, split between the
// runs that were active, kept per pair in localStorage so that a reload keeps counting.
// On a Ray cluster, one block per node the pair's runs are on, labelled by the node's
// name, with the same tiles (each node samples itself: workers/node_telemetry.py).

import * as f from "./format.js";
import { ACTIVE } from "./run_states.js";

const WINDOW_S = 300;

const TILES = [
  { key: "gpu", gpu: true, name: "GPU busy", value: (s) => f.pct(s.gpu_util_pct),
    why: "Share of the last interval in which a kernel ran: near 100% while a step computes." },
  { key: "vram", gpu: true, name: "VRAM", value: (s) => `${f.bytes(s.vram_used_bytes)} / ${f.bytesRound(s.vram_total_bytes)}`,
    why: "Weights, AdamW moments, activations and the allocator's cache; the whole card, all processes." },
  { key: "power", gpu: true, name: "Power", value: (s) => `${f.watts(s.power_w)} / ${f.watts(s.power_limit_w)}`,
    why: "Board power: rises with busy SMs and memory traffic; capped at the limit." },
  { key: "temp", gpu: true, name: "Temperature", value: (s) => (f.isNum(s.temp_c) ? `${Math.round(s.temp_c)} °C` : "– °C"),
    why: "Follows power with a lag; past its limit the card lowers its clock." },
  { key: "sm", gpu: true, name: "SM clock", value: (s) => (f.isNum(s.sm_clock_mhz) ? `${Math.round(s.sm_clock_mhz)} MHz` : "– MHz"),
    why: "Boosts while cool and under the power limit; drops when either is hit." },
  { key: "membus", gpu: true, name: "Memory bus", value: (s) => f.pct(s.mem_bus_util_pct),
    why: "Share of time VRAM was read or written: attention and the optimizer step move the most." },
  { key: "fan", gpu: true, name: "Fan", value: (s) => f.pct(s.fan_pct),
    why: "Spins up as the card heats; passively cooled server cards report none." },
  { key: "pcie", gpu: true, name: "PCIe", value: (s) => `to GPU ${f.rate(s.pcie_rx_bytes_s)} · from GPU ${f.rate(s.pcie_tx_bytes_s)}`,
    why: "Batches of token ids cross the PCIe bus into the GPU each step; weights never leave it." },
  { key: "cpu", name: "CPU", value: (s) => f.pct(s.cpu_pct),
    why: "The whole machine: the Python training loops (all the math when there is no GPU), the server, this stream." },
  { key: "ram", name: "RAM", value: (s) => `${f.bytes(s.ram_used_bytes)} of ${f.bytesRound(s.ram_total_bytes)}`,
    why: "Trainer processes, the tokenized dataset in memory, the server; page cache not counted." },
  { key: "disk", name: "Disk", value: (s) => `read ${f.rate(s.disk_read_bytes_s)} · write ${f.rate(s.disk_write_bytes_s)}`,
    why: "Reads: token windows from the tokenized dataset (mostly from page cache). Writes: checkpoints are the disk writes, one burst each." },
  { key: "net", name: "Network", value: (s) => `in ${f.rate(s.net_in_bytes_s)} · out ${f.rate(s.net_out_bytes_s)}`,
    why: "In: dataset downloads. Out: metrics and checkpoint uploads to a remote mirror; loopback not counted." },
  { key: "now", name: "Drawing now", value: (s) => f.watts(s.power_now_w),
    why: "GPU board power from NVML, or the CPU packages' power from RAPL when there is no GPU." },
];

/** Energy, power cost and rent of this pair, split evenly between the runs active when
 * each sample arrived. Counters are cumulative, so a gap (a closed tab) is still counted. */
export class EnergyLedger {
  constructor(pairId) {
    this.key = `crashdrill.energy.${pairId}`;
    let saved = null;
    try {
      saved = JSON.parse(localStorage.getItem(this.key) || "null");
    } catch {
      saved = null;
    }
    this.state = saved && saved.v === 1 ? saved : { v: 1, last: null, runs: {}, total: zero(), spark: [] };
  }

  add(sample, pair) {
    if (!sample || !f.isNum(sample.t)) return;
    const s = this.state;
    const now = { t: sample.t, j: sample.energy_j_total, power: sample.cost_power_usd, rent: sample.cost_rent_usd };
    const last = s.last;
    if (last && sample.t <= last.t) return;
    s.last = now;
    s.hasEnergy = sample.energy_source != null;
    s.spark.push([sample.t, sample.power_now_w ?? null, sample.cpu_pct ?? null]);
    while (s.spark.length && s.spark[0][0] < sample.t - WINDOW_S) s.spark.shift();
    if (last) {
      const d = {
        kwh: delta(last.j, now.j) / 3.6e6,
        powerUsd: delta(last.power, now.power),
        rentUsd: delta(last.rent, now.rent),
      };
      const active = pair.ordered().filter((r) => ACTIVE.has(r.view.state));
      if (active.length) {
        for (const k of Object.keys(d)) s.total[k] += d[k];
        for (const r of active) {
          const acc = (s.runs[r.id] ||= zero());
          for (const k of Object.keys(d)) acc[k] += d[k] / active.length;
        }
      }
    }
    try {
      localStorage.setItem(this.key, JSON.stringify(s));
    } catch {
      /* private mode or full: keep counting in memory */
    }
  }

  forRun(id) {
    return { ...(this.state.runs[id] || zero()), hasEnergy: !!this.state.hasEnergy };
  }
}

function zero() {
  return { kwh: 0, powerUsd: 0, rentUsd: 0 };
}

function delta(a, b) {
  return f.isNum(a) && f.isNum(b) && b >= a ? b - a : 0;
}

export class MachinePanel {
  constructor(root) {
    this.root = root;
    this.head = root.querySelector(".machine-head");
    this.noGpu = root.querySelector(".no-gpu");
    this.grid = root.querySelector(".tiles");
    this.spark = root.querySelector(".spark");
    this.sparkNote = root.querySelector(".spark-note");
    this.sparkValue = root.querySelector(".spark-value");
    this.energy = root.querySelector(".experiment-energy");
    this.energyNote = root.querySelector(".experiment-cost");
    this.nodes = root.querySelector(".node-blocks");
    this.nodesDrawn = "";
    this.tiles = new Map();
    for (const t of TILES) {
      const div = document.createElement("div");
      div.className = "tile";
      div.dataset.tile = t.key;
      if (t.gpu) div.dataset.gpu = "1";
      div.innerHTML = `<span class="tile-name"></span><span class="tile-value">–</span><p class="tile-why"></p>`;
      div.querySelector(".tile-name").textContent = t.name;
      div.querySelector(".tile-why").textContent = t.why;
      this.grid.append(div);
      this.tiles.set(t.key, div.querySelector(".tile-value"));
    }
  }

  /** The samples of the nodes this pair trains on ([] on one machine: no blocks). */
  updateNodes(samples) {
    this.root.dataset.nodes = String(samples.length);
    const signature = samples.map((s) => `${s.node.node_id}:${s.t}`).join();
    if (signature === this.nodesDrawn) {
      for (const [i, s] of samples.entries()) this.nodes.children[i].querySelector(".node-ago").textContent = f.ago(s.t);
      return;
    }
    this.nodesDrawn = signature;
    this.nodes.hidden = !samples.length;
    this.nodes.replaceChildren(...samples.map((s) => nodeBlock(s)));
  }

  update(sample, ledger) {
    if (!sample) {
      this.head.textContent = "Waiting for the first machine sample (every 2 s)…";
      return;
    }
    const gpuOk = sample.gpu_state === "ok";
    this.root.dataset.gpu = sample.gpu_state || "no_gpu";
    const who = gpuOk ? sample.gpu_name || "NVIDIA GPU" : "no GPU on this machine";
    const where = this.root.dataset.nodes > 0 ? "The server: " : "";
    this.head.textContent = `${where}${who} · sampled ${f.ago(sample.t)}`;
    this.noGpu.hidden = gpuOk;
    if (!gpuOk) {
      // Words for people; the sampler's raw reason ("nvmlInit failed: …") in a tooltip.
      this.noGpu.textContent = sample.gpu_state === "nvml_error"
        ? "The NVIDIA GPU could not be read: GPU fields are not shown."
        : "No NVIDIA GPU on this machine: GPU fields are not shown. The runs train on the CPU, so the CPU, RAM and disk tiles tell the story.";
      if (sample.gpu_reason) this.noGpu.title = `the sampler said: ${sample.gpu_reason}`;
      else this.noGpu.removeAttribute("title");
    }
    if (this.drawnT === sample.t) return; // only "sampled N s ago" moves between samples
    this.drawnT = sample.t;
    for (const t of TILES) {
      const v = this.tiles.get(t.key);
      v.parentElement.hidden = !!t.gpu && !gpuOk;
      v.textContent = t.value(sample);
    }
    this.drawSpark(ledger.state.spark, sample.t);
    const total = ledger.state.total;
    if (sample.energy_source) {
      this.energy.textContent = f.kwh(total.kwh);
      this.energyNote.textContent = `≈ ${f.usd(total.powerUsd)} of electricity · ≈ ${f.usd(total.rentUsd)} to rent `
        + `(${sample.energy_source === "nvml" ? "the GPU's energy counter" : "the CPU packages' RAPL counters"})`;
    } else {
      this.energy.textContent = "–";
      this.energyNote.textContent = `no energy counter here (needs NVML or readable RAPL) · ≈ ${f.usd(total.rentUsd)} to rent`;
    }
  }

  drawSpark(points, now) {
    const usePower = points.some((p) => f.isNum(p[1]));
    const idx = usePower ? 1 : 2;
    const pts = points.filter((p) => f.isNum(p[idx]));
    const W = 240;
    const H = 40;
    const max = usePower ? Math.max(1, ...pts.map((p) => p[idx])) : 100;
    const xy = pts.map((p) => `${(W * (1 - (now - p[0]) / WINDOW_S)).toFixed(1)},${(H - 2 - ((H - 4) * p[idx]) / max).toFixed(1)}`);
    this.spark.querySelector("polyline").setAttribute("points", xy.join(" "));
    const lastV = pts.length ? pts[pts.length - 1][idx] : null;
    const what = usePower ? `power, peak ${f.watts(max)}` : "CPU busy %, 0–100";
    this.sparkNote.textContent = pts.length ? `last 5 minutes · ${what}` : "last 5 minutes · –";
    // The tile's value: the window's mean, next to the newest sample.
    const mean = pts.length ? pts.reduce((n, p) => n + p[idx], 0) / pts.length : null;
    const fmt = usePower ? f.watts : f.pct;
    this.sparkValue.textContent = pts.length
      ? `${usePower ? "power" : "CPU"} ${fmt(lastV)} now · mean ${fmt(mean)}`
      : "–";
    this.spark.setAttribute("aria-label", pts.length
      ? `Last 5 minutes of ${usePower ? "power" : "CPU use"}: ${pts.length} samples, now ${usePower ? f.watts(lastV) : f.pct(lastV)}`
      : "No samples yet");
  }
}

/** One node's block: its name, its GPU, and the tiles' values (the "why" lines are the
 * server's tiles above). */
function nodeBlock(sample) {
  const gpuOk = sample.gpu_state === "ok";
  const div = document.createElement("div");
  div.className = "node-block";
  div.dataset.node = sample.node.node_id;
  const h = document.createElement("h3");
  h.className = "node-name";
  h.textContent = `Node ${sample.node.name}`;
  const head = document.createElement("p");
  head.className = "node-head";
  head.append(`${gpuOk ? sample.gpu_name || "NVIDIA GPU" : "no GPU on this node"} · sampled `);
  const ago = document.createElement("span");
  ago.className = "node-ago";
  ago.textContent = f.ago(sample.t);
  head.append(ago);
  const grid = document.createElement("div");
  grid.className = "tiles";
  for (const t of TILES) {
    if (t.gpu && !gpuOk) continue;
    const tile = document.createElement("div");
    tile.className = "tile";
    tile.dataset.tile = t.key;
    const name = document.createElement("span");
    name.className = "tile-name";
    name.textContent = t.name;
    const value = document.createElement("span");
    value.className = "tile-value";
    value.textContent = t.value(sample);
    tile.append(name, value);
    grid.append(tile);
  }
  div.append(h, head, grid);
  return div;
}
