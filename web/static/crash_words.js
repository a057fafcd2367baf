// What the control bar says about a lesson's Crash test: the hint under the button, from
// the lesson's crash mode (its fields in GET /api/record-kinds `crash_modes`, never its
// name), and the line after a kill, which says only what has happened so far: the kill,
// then what the restart did once its trainer said so (resumed from a checkpoint, started
// over, refused for want of one). Nothing here promises a resume before one happened.

import * as f from "./format.js";

/** The hint under Crash test for a lesson whose crash mode is `mode` (its registry entry:
 * waits_for_save, wipes_disk, moves_host, one_rank); `cluster`: the lab has other machines to move
 * a run to. */
export function crashHint(mode, cluster = false) {
  if (mode?.waits_for_save) return "Arms a SIGKILL for the next checkpoint write: it lands in the middle of that write.";
  if (mode?.moves_host) {
    return cluster
      ? "SIGKILL and its machine gone: it restarts on another machine from what the mirror kept."
      : "SIGKILL and its disk deleted (no other machine here): it restarts from what the mirror kept.";
  }
  if (mode?.wipes_disk) return "SIGKILL now, then its local checkpoints are deleted: only the mirror's copies are left.";
  if (mode?.one_rank) return "Kills one rank's process with SIGKILL: its launcher takes the group down, and it restarts from its last checkpoint.";
  return "Kills the process with SIGKILL now: no chance to save.";
}

/** The words of a button for a crash mode the lesson offers besides its own (its preset's
 * `[crash] offer`), from the mode's fields: [label, what it does]. */
export function offerWords(mode) {
  if (mode?.one_rank) return ["Kill one rank", "SIGKILL of one rank's process, not the whole group: its launcher sees the rank lost, and the group restarts from its last checkpoint."];
  if (mode?.moves_host) return ["Lose its machine", mode.summary];
  if (mode?.wipes_disk) return ["Kill and wipe its disk", mode.summary];
  return ["Kill the whole run", mode?.summary || "SIGKILL now"];
}

/** What a restart is doing, from the supervisor's restart event `e` (written once the old
 * trainer is dead, before the new one loaded anything: its `resume_from` is the newest
 * checkpoint found, null: none). `started`: the new trainer is starting, said as the rest
 * of "Restarted after the crash: …". */
export function restartingText(e, started = false) {
  const ckpt = e && f.isNum(e.resume_from) ? f.int(e.resume_from) : null;
  if (started) {
    if (ckpt !== null) return `loading its checkpoint at step ${ckpt}.`;
    return e ? "no checkpoint was left where it restarts; the trainer is looking." : "looking for a checkpoint.";
  }
  if (ckpt !== null) return `Restarting to load its checkpoint at step ${ckpt}.`;
  return e ? "Restarting; no checkpoint was left where it restarts." : "Restarting.";
}

/** What the restart after a kill did, from the run's crashes() entry of the segment it
 * started (`after`, with `rejected`: its trainer rejected a checkpoint that failed its
 * checks), or "" while its trainer has not said yet. */
function outcome(after) {
  if (!after) return "";
  if (after.refused && after.rejected) {
    return "; its restart rejected its checkpoint (it failed its checks), found nothing older and refused to start (exit 3)";
  }
  if (after.refused) return "; its restart found no checkpoint to load and refused to start (exit 3)";
  if (after.fresh) return "; its restart found no checkpoint and started over from step 0";
  if (f.isNum(after.from)) return `; resumed from the checkpoint at step ${f.int(after.from)}`;
  return "";
}

/** "Killed process 16083 at step 198[, in the middle of writing the checkpoint for step
 * 200]." then, once the restart said what it did, "…; resumed from the checkpoint at step
 * 100." (`event`: the supervisor's crash event, `after`: the crashes() entry of the
 * segment the restart started; either may be missing yet). */
export function killText(pid, step, event = null, after = null) {
  const save = event?.save_step; // a crash event's field: the checkpoint being written
  const where = Number.isInteger(save) ? `, in the middle of writing the checkpoint for step ${save}` : "";
  const then = outcome(after);
  const pending = then ? "" : event ? "; restarting it" : "";
  const rank = Number.isInteger(event?.lost_rank) ? ` (rank ${event.lost_rank})` : ""; // a rank crash's event
  return `Killed process ${pid ?? "?"}${rank} at step ${step ?? "?"}${where}${then || pending}.`;
}

/** The cost line of a resume check `c` whose segment began after `kind` ("crash" or
 * "preempt": a preemption, a session wall, a graceful stop). A stop that saved the step it
 * stopped at lost nothing: it says what it saved, not "cost 0 steps". */
export function checkCost(c, kind = "crash") {
  const lost = c.expected_points;
  const what = kind === "preempt" ? "stop" : "crash";
  if (!f.isNum(lost)) return null;
  if (c.outcome === "fresh") return `The ${what} cost all ${f.int(lost)} steps trained before it: a fresh start from step 0, not a resume.`;
  if (!f.isNum(c.from_step)) return null;
  if (lost === 0) {
    return kind === "preempt"
      ? `Nothing to redo: the stop saved a checkpoint of step ${f.int(c.from_step)}, the last step it trained, and the run resumed from it.`
      : `Nothing to redo: the newest checkpoint was of step ${f.int(c.from_step)}, the last step trained before the crash.`;
  }
  return `The ${what} cost ${f.int(lost)} step${lost === 1 ? "" : "s"} of work (trained since the checkpoint at step ${f.int(c.from_step)}, then recomputed).`;
}
